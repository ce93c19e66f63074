//! The life of one HTTP stream as a plain state machine, without host calls: when to hold the request (Pause), when
//! to route and with what, and the in-flight slot taken once and released exactly once. `http` feeds it the
//! callbacks Envoy makes and carries out the returned [`Step`]s; these unit tests run natively
//! (`cargo test -p warmpath-filter --lib`).
//!
//! Request side: a strategy that ignores the body decides at header time; PREFIX_AWARE holds the headers until the
//! body is complete (end of stream in the body callback, or trailers, which Envoy sends instead of an
//! end-of-stream body), or routes at once when there is no body or the body (declared or buffered) outgrows
//! `max_body_bytes`.
//!
//! Either way the stream notes a body larger than `max_body_bytes` (declared, buffered or streamed through):
//! [`Ended::oversized`].
//!
//! Response side (the points later work hooks into): [`Stream::on_response_headers`] (status known),
//! [`Stream::on_response_body`] reporting the first body byte once, and [`Stream::on_end`], which runs once for every
//! stream that ends — finished, reset by either side, aborted — and hands back the slot to release.

/// How this stream is handled, fixed when its request headers arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Not ours (another instance's upstream cluster) or no router: nothing to route, nothing held.
    PassThrough,
    /// The strategy ignores the body (RANDOM, LEAST_OUTSTANDING_REQUESTS): route at header time.
    Keyless {
        /// The largest body the filter would hold, in bytes: a larger one is an oversized upload.
        max_body_bytes: usize,
        /// The request's `content-length`, when it sent a valid one (bytes).
        content_length: Option<u64>,
    },
    /// The strategy reads the body (PREFIX_AWARE): buffer up to `max_body_bytes`, then route.
    Body {
        /// The largest body that is buffered and parsed, in bytes.
        max_body_bytes: usize,
        /// The request's `content-length`, when it sent a valid one (bytes).
        content_length: Option<u64>,
    },
}

/// What the request is routed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteOn {
    /// No key is needed (body-blind strategy).
    Keyless,
    /// The request has no body (fail open).
    NoBody,
    /// The body is larger than `max_body_bytes` (fail open; forwarded unparsed).
    BodyTooLarge,
    /// The whole body is buffered: read `len` bytes of it.
    Body {
        /// Bytes buffered.
        len: usize,
    },
    /// The body ended with trailers: read what is buffered (up to `max_body_bytes`; empty means no body).
    BodyBeforeTrailers {
        /// The most to read, in bytes.
        max: usize,
    },
}

/// What the shell does after a callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Let the stream go on.
    Continue,
    /// Hold the request (headers, or body so far) in Envoy's buffer.
    Pause,
    /// Route now (pick, take the slot, set the header), then let the stream go on.
    Route(RouteOn),
}

/// Where the request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Request headers not seen yet.
    Start,
    /// Headers held until the body is complete.
    WaitingForBody { max_body_bytes: usize },
    /// Routed, passed through, or nothing more to do on the request side.
    Done,
}

/// The state of one stream.
#[derive(Debug)]
pub struct Stream {
    phase: Phase,
    /// The endpoint whose in-flight slot this stream holds, until [`Stream::on_end`].
    slot: Option<String>,
    /// The upstream response status, once its headers arrived.
    status: Option<u16>,
    /// True once the first response body byte was seen.
    first_byte: bool,
    /// Prefill work (endpoint, bytes of prompt text) this stream added to the endpoint's pending prefill; held
    /// until the first response body byte or the end of the stream, whichever comes first.
    pending: Option<(String, u32)>,
    ended: bool,
    /// The body size past which an upload that streams through unbuffered is oversized (`None`: not counted).
    upload_limit: Option<usize>,
    /// Bytes of the body that streamed through unbuffered so far.
    uploaded: u64,
    /// The body is larger than `max_body_bytes`: declared so, or seen so while buffered or streaming through.
    oversized: bool,
}

/// What [`Stream::on_end`] hands back, once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    /// The endpoint whose slot to release (`None`: no slot was taken).
    pub slot: Option<String>,
    /// The response status seen in the response headers (`None`: no response headers reached the filter).
    pub status: Option<u16>,
    /// True if any response body byte reached the filter.
    pub first_byte: bool,
    /// The request's body was larger than `max_body_bytes`: a reset of it is not counted against its endpoint
    /// (`outcome::classify`).
    pub oversized: bool,
}

impl Default for Stream {
    fn default() -> Self {
        Stream::new()
    }
}

impl Stream {
    /// A stream whose request headers have not arrived.
    pub fn new() -> Self {
        Stream {
            phase: Phase::Start,
            slot: None,
            status: None,
            first_byte: false,
            pending: None,
            ended: false,
            upload_limit: None,
            uploaded: 0,
            oversized: false,
        }
    }

    /// The request headers arrived; `end_of_stream` means there is no body.
    pub fn on_request_headers(&mut self, mode: Mode, end_of_stream: bool) -> Step {
        if self.phase != Phase::Start {
            return Step::Continue;
        }
        self.phase = Phase::Done;
        match mode {
            Mode::PassThrough => Step::Continue,
            Mode::Keyless { max_body_bytes, content_length } => {
                self.upload_limit = Some(max_body_bytes);
                self.oversized = content_length.is_some_and(|len| len > max_body_bytes as u64);
                Step::Route(RouteOn::Keyless)
            }
            Mode::Body { .. } if end_of_stream => Step::Route(RouteOn::NoBody),
            // A body declared larger than the filter reads is never held. Holding even its first `max_body_bytes`
            // risks a 413 plain Envoy would not send: while a filter buffers, Envoy appends each chunk it read to
            // the held body before the filter sees it, and a loaded Envoy can read megabytes in one chunk, pushing
            // the held body over the listener's buffer limit.
            Mode::Body { max_body_bytes, content_length: Some(len) } if len > max_body_bytes as u64 => {
                self.oversized = true;
                Step::Route(RouteOn::BodyTooLarge)
            }
            Mode::Body { max_body_bytes, .. } => {
                // Hold the headers until the body is buffered (needs `allow_on_headers_stop_iteration: true`).
                self.phase = Phase::WaitingForBody { max_body_bytes };
                Step::Pause
            }
        }
    }

    /// A request body chunk arrived; `buffered` is the size buffered so far while the request is held, else the
    /// chunk's own size (Envoy hands a filter that lets the stream go on each chunk alone).
    pub fn on_request_body(&mut self, buffered: usize, end_of_stream: bool) -> Step {
        let Phase::WaitingForBody { max_body_bytes } = self.phase else {
            if let Some(limit) = self.upload_limit {
                self.uploaded = self.uploaded.saturating_add(buffered as u64);
                self.oversized |= self.uploaded > limit as u64;
            }
            return Step::Continue;
        };
        if buffered > max_body_bytes {
            // Stop buffering here: the body goes on unparsed.
            self.phase = Phase::Done;
            self.oversized = true;
            return Step::Route(RouteOn::BodyTooLarge);
        }
        if !end_of_stream {
            return Step::Pause;
        }
        self.phase = Phase::Done;
        if buffered == 0 {
            Step::Route(RouteOn::NoBody)
        } else {
            Step::Route(RouteOn::Body { len: buffered })
        }
    }

    /// Request trailers arrived: a body followed by trailers never reports end of stream in the body callback.
    pub fn on_request_trailers(&mut self) -> Step {
        let Phase::WaitingForBody { max_body_bytes } = self.phase else { return Step::Continue };
        self.phase = Phase::Done;
        Step::Route(RouteOn::BodyBeforeTrailers { max: max_body_bytes })
    }

    /// The routed request holds an in-flight slot on `address` (taken once; a second call is ignored).
    pub fn took_slot(&mut self, address: String) {
        if self.slot.is_none() && !self.ended {
            self.slot = Some(address);
        }
    }

    /// The routed request added `bytes` of prefill work to `address`'s pending prefill (taken once; ignored after
    /// the first response byte or the end).
    pub fn took_pending(&mut self, address: String, bytes: u32) {
        if self.pending.is_none() && !self.first_byte && !self.ended {
            self.pending = Some((address, bytes));
        }
    }

    /// The pending prefill work to release now, once: after the first response body byte (the server has
    /// prefilled the prompt: for streaming responses that is the first token; a non-streaming body arrives when
    /// generation is done) or at the end of the stream (finished, reset, aborted) if no byte came.
    pub fn take_pending(&mut self) -> Option<(String, u32)> {
        if self.first_byte || self.ended {
            self.pending.take()
        } else {
            None
        }
    }

    /// The endpoint whose slot this stream holds, if any.
    pub fn slot(&self) -> Option<&str> {
        self.slot.as_deref()
    }

    /// The response headers arrived with `status` (`None` when unreadable).
    pub fn on_response_headers(&mut self, status: Option<u16>) {
        if self.status.is_none() {
            self.status = status;
        }
    }

    /// A response body chunk of `size` bytes arrived; true exactly once, for the first chunk carrying a byte.
    pub fn on_response_body(&mut self, size: usize) -> bool {
        if self.first_byte || size == 0 {
            return false;
        }
        self.first_byte = true;
        true
    }

    /// The stream ended (Envoy's log callback: finished, reset or aborted). `Some` exactly once.
    pub fn on_end(&mut self) -> Option<Ended> {
        if self.ended {
            return None;
        }
        self.ended = true;
        self.phase = Phase::Done;
        Some(Ended {
            slot: self.slot.take(),
            status: self.status,
            first_byte: self.first_byte,
            oversized: self.oversized,
        })
    }

    /// The request's body is larger than `max_body_bytes`, as far as seen so far ([`Ended::oversized`]).
    pub fn oversized(&self) -> bool {
        self.oversized
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: Mode = Mode::Body { max_body_bytes: 100, content_length: None };
    const KEYLESS: Mode = Mode::Keyless { max_body_bytes: 100, content_length: None };

    #[test]
    fn keyless_routes_at_header_time_and_ignores_the_body() {
        let mut s = Stream::new();
        assert_eq!(s.on_request_headers(KEYLESS, false), Step::Route(RouteOn::Keyless));
        assert_eq!(s.on_request_body(10, true), Step::Continue);
        assert_eq!(s.on_request_trailers(), Step::Continue);
    }

    #[test]
    fn pass_through_never_routes() {
        let mut s = Stream::new();
        assert_eq!(s.on_request_headers(Mode::PassThrough, false), Step::Continue);
        assert_eq!(s.on_request_body(10, false), Step::Continue);
        assert_eq!(s.on_request_body(20, true), Step::Continue);
        assert_eq!(s.on_end(), Some(Ended { slot: None, status: None, first_byte: false, oversized: false }));
    }

    #[test]
    fn body_is_held_until_complete_then_routed_once() {
        let mut s = Stream::new();
        assert_eq!(s.on_request_headers(BODY, false), Step::Pause);
        assert_eq!(s.on_request_body(10, false), Step::Pause);
        assert_eq!(s.on_request_body(40, true), Step::Route(RouteOn::Body { len: 40 }));
        // Nothing routes twice, whatever Envoy calls next.
        assert_eq!(s.on_request_body(40, true), Step::Continue);
        assert_eq!(s.on_request_trailers(), Step::Continue);
        assert_eq!(s.on_request_headers(BODY, false), Step::Continue);
    }

    #[test]
    fn no_body_routes_at_once() {
        let mut s = Stream::new();
        assert_eq!(s.on_request_headers(BODY, true), Step::Route(RouteOn::NoBody));
        let mut s = Stream::new();
        assert_eq!(s.on_request_headers(BODY, false), Step::Pause);
        assert_eq!(s.on_request_body(0, true), Step::Route(RouteOn::NoBody));
    }

    #[test]
    fn oversized_body_stops_buffering_and_goes_on_unparsed() {
        let mut s = Stream::new();
        assert_eq!(s.on_request_headers(BODY, false), Step::Pause);
        assert_eq!(s.on_request_body(101, false), Step::Route(RouteOn::BodyTooLarge));
        assert_eq!(s.on_request_body(500, false), Step::Continue, "no more pausing after the decision");
        assert_eq!(s.on_request_body(900, true), Step::Continue);
    }

    #[test]
    fn body_declared_too_large_is_never_held() {
        let mut s = Stream::new();
        let declared = |len| Mode::Body { max_body_bytes: 100, content_length: Some(len) };
        assert_eq!(s.on_request_headers(declared(101), false), Step::Route(RouteOn::BodyTooLarge));
        assert_eq!(s.on_request_body(50, false), Step::Continue, "not held, not routed again");
        assert_eq!(s.on_request_body(101, true), Step::Continue);
        // A declared length within the limit is held as usual.
        let mut s = Stream::new();
        assert_eq!(s.on_request_headers(declared(100), false), Step::Pause);
        assert_eq!(s.on_request_body(100, true), Step::Route(RouteOn::Body { len: 100 }));
    }

    #[test]
    fn an_upload_over_the_limit_is_oversized_however_it_shows() {
        let ended = |s: &mut Stream| s.on_end().expect("end").oversized;
        // Declared larger, held and outgrowing the limit, or neither.
        let mut s = Stream::new();
        s.on_request_headers(Mode::Body { max_body_bytes: 100, content_length: Some(101) }, false);
        assert!(s.oversized() && ended(&mut s));
        let mut s = Stream::new();
        s.on_request_headers(BODY, false);
        assert!(!s.oversized(), "not known before the body");
        s.on_request_body(101, false);
        assert!(ended(&mut s));
        let mut s = Stream::new();
        s.on_request_headers(BODY, false);
        s.on_request_body(100, true);
        assert!(!ended(&mut s), "a body the filter holds whole");
        // A body-blind strategy: declared larger, or streamed through larger chunk by chunk.
        let mut s = Stream::new();
        s.on_request_headers(Mode::Keyless { max_body_bytes: 100, content_length: Some(101) }, false);
        assert!(ended(&mut s));
        let mut s = Stream::new();
        s.on_request_headers(KEYLESS, false);
        s.on_request_body(60, false);
        assert!(!s.oversized());
        s.on_request_body(41, true);
        assert!(ended(&mut s), "101 bytes streamed through");
        let mut s = Stream::new();
        s.on_request_headers(KEYLESS, false);
        s.on_request_body(60, false);
        s.on_request_body(40, true);
        assert!(!ended(&mut s), "100 bytes: within the limit");
        // A stream that is not ours counts nothing.
        let mut s = Stream::new();
        s.on_request_headers(Mode::PassThrough, false);
        s.on_request_body(1000, true);
        assert!(!ended(&mut s));
    }

    #[test]
    fn trailers_end_a_held_body() {
        let mut s = Stream::new();
        assert_eq!(s.on_request_headers(BODY, false), Step::Pause);
        assert_eq!(s.on_request_body(30, false), Step::Pause);
        assert_eq!(s.on_request_trailers(), Step::Route(RouteOn::BodyBeforeTrailers { max: 100 }));
        assert_eq!(s.on_request_trailers(), Step::Continue);
    }

    #[test]
    fn the_slot_is_released_exactly_once() {
        let mut s = Stream::new();
        s.on_request_headers(KEYLESS, true);
        s.took_slot("10.0.0.1:80".into());
        s.took_slot("10.0.0.2:80".into());
        assert_eq!(s.slot(), Some("10.0.0.1:80"), "the first slot is the one held");
        let end = s.on_end().expect("first end");
        assert_eq!(end.slot.as_deref(), Some("10.0.0.1:80"));
        assert_eq!(s.on_end(), None, "a second end releases nothing");
        s.took_slot("10.0.0.3:80".into());
        assert_eq!(s.slot(), None, "no slot after the end");
    }

    #[test]
    fn a_reset_before_any_response_ends_with_the_slot_and_no_status() {
        let mut s = Stream::new();
        assert_eq!(s.on_request_headers(BODY, false), Step::Pause);
        assert_eq!(s.on_request_body(5, true), Step::Route(RouteOn::Body { len: 5 }));
        s.took_slot("10.0.0.1:80".into());
        let end = s.on_end().expect("end");
        assert_eq!(end, Ended { slot: Some("10.0.0.1:80".into()), status: None, first_byte: false, oversized: false });
    }

    #[test]
    fn a_reset_while_the_body_is_held_ends_cleanly() {
        let mut s = Stream::new();
        assert_eq!(s.on_request_headers(BODY, false), Step::Pause);
        assert_eq!(s.on_request_body(5, false), Step::Pause);
        assert_eq!(s.on_end().map(|e| e.slot), Some(None));
        assert_eq!(s.on_request_body(5, true), Step::Continue, "nothing routes after the end");
    }

    #[test]
    fn response_side_reports_status_and_the_first_byte_once() {
        let mut s = Stream::new();
        s.on_request_headers(KEYLESS, true);
        s.took_slot("10.0.0.1:80".into());
        s.on_response_headers(Some(200));
        s.on_response_headers(Some(500));
        assert!(!s.on_response_body(0), "an empty chunk is no byte");
        assert!(s.on_response_body(3));
        assert!(!s.on_response_body(3), "first byte reported once");
        let end = s.on_end().expect("end");
        assert_eq!((end.status, end.first_byte), (Some(200), true));
    }

    #[test]
    fn pending_prefill_is_released_once_at_the_first_byte() {
        let mut s = Stream::new();
        s.on_request_headers(BODY, true);
        s.took_pending("10.0.0.1:80".into(), 700);
        assert_eq!(s.take_pending(), None, "held while the prompt is being prefilled");
        s.on_response_headers(Some(200));
        assert_eq!(s.take_pending(), None, "response headers come before the first token");
        assert!(s.on_response_body(5));
        assert_eq!(s.take_pending(), Some(("10.0.0.1:80".into(), 700)));
        assert_eq!(s.take_pending(), None, "released once");
        s.on_end();
        assert_eq!(s.take_pending(), None, "nothing left at the end");
    }

    #[test]
    fn pending_prefill_is_released_at_the_end_of_a_reset_stream() {
        let mut s = Stream::new();
        s.on_request_headers(BODY, true);
        s.took_pending("10.0.0.1:80".into(), 300);
        assert!(s.on_end().is_some());
        assert_eq!(s.take_pending(), Some(("10.0.0.1:80".into(), 300)));
        assert_eq!(s.take_pending(), None);
        s.took_pending("10.0.0.2:80".into(), 1);
        assert_eq!(s.take_pending(), None, "nothing is taken after the end");
    }
}

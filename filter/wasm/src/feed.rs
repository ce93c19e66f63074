//! The endpoint/load feed poller (issue 5) — not wired yet: a configured `feed` is accepted but not polled, and
//! endpoints come from the plugin configuration only.

use std::cell::RefCell;
use std::rc::Rc;

use log::warn;
use warmpath_core::{FeedSettings, Router, ServerLoad};

/// Server-side load of `address` from the last applied feed snapshot (none until the poller exists).
pub fn server_load(_address: &str) -> Option<ServerLoad> {
    None
}

/// Placeholder poller: logs once that feeds are not supported by this build.
pub struct FeedPoller;

impl FeedPoller {
    /// Logs that `settings` will not be polled.
    pub fn new(settings: FeedSettings, _context_id: u32) -> Self {
        warn!("feed `{}` configured but this build does not poll feeds yet", settings.cluster);
        FeedPoller
    }

    /// Does nothing yet.
    pub fn on_tick(&mut self, _now_ms: u64, _router: &Rc<RefCell<Router>>) {}

    /// Does nothing yet.
    pub fn on_response(&mut self, _token: u32, _body_size: usize, _router: &Rc<RefCell<Router>>) {}
}

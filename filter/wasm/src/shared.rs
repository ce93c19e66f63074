//! In-flight request counters per endpoint, shared by every VM (main thread and each Envoy worker) through proxy-wasm
//! shared data. This is the only compare-and-swap code in the filter.
//!
//! Layout: key `warmpath.in_flight.<IP:port>` → 4-byte little-endian `u32`. A missing key reads as 0.
//!
//! Every update is read → modify → `set_shared_data(.., cas)`; a CAS mismatch (another worker wrote in between)
//! retries with the fresh value. Decrements saturate at 0, so a lost first write (Envoy ignores the CAS token when it
//! creates a key, so two workers creating the same key at once can both "win") cannot leave a counter stuck above 0
//! once traffic stops.

use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;

const KEY_PREFIX: &str = "warmpath.in_flight.";
/// Attempts before an update gives up (counted as a CAS failure by the caller); contention is between at most a few
/// worker threads, so a handful of retries always suffices in practice.
const MAX_CAS_ATTEMPTS: usize = 64;

fn key(address: &str) -> String {
    let mut k = String::with_capacity(KEY_PREFIX.len() + address.len());
    k.push_str(KEY_PREFIX);
    k.push_str(address);
    k
}

fn decode(bytes: Option<&[u8]>) -> u32 {
    match bytes {
        Some(b) if b.len() == 4 => u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        _ => 0,
    }
}

/// Current in-flight count of `address` (0 when unknown or on a host error).
pub fn in_flight(address: &str) -> u32 {
    match hostcalls::get_shared_data(&key(address)) {
        Ok((bytes, _)) => decode(bytes.as_deref()),
        Err(_) => 0,
    }
}

/// Adds `delta` (saturating at 0 and `u32::MAX`) to the counter of `address` with compare-and-swap.
///
/// Returns the new value, or `None` when the host kept refusing the write (CAS mismatch `MAX_CAS_ATTEMPTS` times in a
/// row, or another host error).
pub fn add(address: &str, delta: i32) -> Option<u32> {
    let k = key(address);
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (bytes, cas) = hostcalls::get_shared_data(&k).ok()?;
        let current = decode(bytes.as_deref());
        let next = if delta >= 0 {
            current.saturating_add(delta.unsigned_abs())
        } else {
            current.saturating_sub(delta.unsigned_abs())
        };
        match hostcalls::set_shared_data(&k, Some(&next.to_le_bytes()), cas) {
            Ok(()) => return Some(next),
            Err(Status::CasMismatch) => continue,
            Err(_) => return None,
        }
    }
    None
}


//! warmpath-e2e: helpers for the end-to-end tests (skeleton; see issue 2).

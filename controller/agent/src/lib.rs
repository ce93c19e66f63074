//! warmpath-agent (skeleton; see issue 6).

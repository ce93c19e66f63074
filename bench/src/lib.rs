//! warmpath-bench (skeleton; see issue 3).

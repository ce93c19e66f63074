//! warmpath-sim (skeleton; see issue 3).

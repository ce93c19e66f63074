//! warmpath-core: the pure routing core (skeleton; see issue 2).

//! warmpath-controller (skeleton; see issues 5 and 6).

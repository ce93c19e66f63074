//! Support for the cluster-less tests in `tests/`: object builders and an in-memory API client that
//! knows every kind the controller reads or writes ([`fixtures`]).

pub mod fixtures;

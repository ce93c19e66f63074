//! Builders for test objects and an in-memory API client (`kube-fake-client`) that knows every
//! type the controller reads or writes. Not used by the controller at run time.

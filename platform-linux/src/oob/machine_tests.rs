//! Tests of the connection state machine.

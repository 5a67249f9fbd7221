// Tests for setpoint/processor/store.h.

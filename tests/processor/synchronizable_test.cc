// Tests for setpoint/processor/synchronizable.h.

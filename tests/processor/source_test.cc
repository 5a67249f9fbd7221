// Tests for setpoint/processor/source.h.

// Tests for setpoint/processor/transformer.h.

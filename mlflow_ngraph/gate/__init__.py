"""The regression gate: a challenger engine against the deployed champion, measured in the
same interleaved rounds on this device, and a verdict beyond noise (docs/gate.md)."""

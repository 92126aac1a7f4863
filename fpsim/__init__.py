"""fpsim: a bit-exact simulator of floating-point formats for mixed-precision training."""

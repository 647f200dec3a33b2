"""Serving-engine plugins: each module maps an engine's kernel call onto a kdispatch op and registers
through the engine's own plugin mechanism, opt-in with one environment switch (see each module)."""

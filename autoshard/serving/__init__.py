"""Capacity-driven scale-out serving: plan, simulate and measure a model served across CPU
servers (Lui et al., ISPASS 2021)."""

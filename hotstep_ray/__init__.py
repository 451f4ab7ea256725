"""hotstep-ray: turn a folder of songs into ACE-Step 1.5 adapters, on Ray."""

__version__ = "0.1.0"

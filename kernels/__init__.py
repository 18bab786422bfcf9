"""kernels: placeholder package (see the issues that build it)."""

"""Forward Fokker-Planck by Euler-Maruyama particles, on numpy, numba and torch."""

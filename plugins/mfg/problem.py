"""The MFG problem family: one 1-D model, four problem types.

Conventions (used by every solver and backend):

- The domain is ``[xmin, xmax]`` with ``Nx`` grid points. Periodic: the points
  are ``xmin + j*dx`` with ``dx = L/Nx`` (``xmax`` is ``xmin`` again);
  reflecting: ``dx = L/(Nx-1)`` and both walls are grid points.
- Time runs over ``[0, T]`` in ``Nt`` steps: arrays in time have ``Nt+1`` rows.
- Diffusion is ``nu = sigma**2/2``; the Hamiltonian is
  ``H(x, p, m) = lam/2 * p**2 - V(x) - f(m)`` with ``V`` and ``f`` running
  costs, so the optimal drift is ``alpha = -lam * dU/dx``.
- Densities integrate to one with :func:`quadrature_weights`.
- Functions are arrays on the grid or named presets, never callables, so every
  problem pickles to worker processes.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from core.validation import (
    FLOAT_MAX,
    FLOAT_TINY,
    INT64_MAX,
    check_array,
    check_choice,
    check_derived,
    check_float,
    check_int,
    check_seed,
    fail,
)
from plugins.mfg import kde

PRESETS = ("towel_beach", "lq", "crowd")
CONGESTION = ("none", "linear", "log")
BOUNDARIES = ("periodic", "reflecting")
KDE_METHODS = ("binned", "direct")
BANDWIDTH_RULES = ("scott", "silverman")


def _gaussian(x: np.ndarray, centre: float, width: float) -> np.ndarray:
    return np.exp(-0.5 * ((x - centre) / width) ** 2)


def lq_ergodic(sigma: float, lam: float, stiffness: float, coef: float) -> tuple[float, float]:
    """Curvature ``a`` of the ergodic value ``u = a/2 (x-x0)^2`` and the density's variance.

    With ``V = k/2 (x-x0)^2`` and ``f(m) = c log m`` the stationary system
    ``-nu u'' + lam/2 u'^2 - V - c log m = -rho``, ``m ~ exp(-lam u / nu)``
    gives ``lam a^2 + (c lam / nu) a - k = 0`` (docs/mfg.md derives it), and
    ``m`` is Gaussian with variance ``nu / (lam a)``.
    """
    nu = sigma**2 / 2
    b = coef * lam / nu
    a = (-b + math.sqrt(b * b + 4 * lam * stiffness)) / (2 * lam)
    return a, nu / (lam * a)


LQ_STIFFNESS = 4.0  # k in V = k/2 (x - x0)^2 for the lq preset


def preset_defaults(name: str) -> dict:
    """Scalar defaults of a preset (fields the user leaves as None take these)."""
    if name == "towel_beach":
        # MFG_PDE's parameters: sigma = 1 and control-cost coefficient 0.5
        return {"xmin": 0.0, "xmax": 1.0, "sigma": 1.0, "lam": 0.5, "congestion": "log", "congestion_coef": 1.0,
                "boundary": "periodic"}
    if name == "lq":
        return {"xmin": -1.5, "xmax": 1.5, "sigma": 0.5, "lam": 1.0, "congestion": "log", "congestion_coef": 0.2,
                "boundary": "reflecting"}
    return {"xmin": 0.0, "xmax": 1.0, "sigma": 0.3, "lam": 1.0, "congestion": "linear", "congestion_coef": 0.5,
            "boundary": "reflecting"}  # crowd


# where each preset's crowd starts: the centre and width of its Gaussian m0
PRESET_CROWD = {"towel_beach": (0.5, 0.1), "lq": (0.6, 0.2), "crowd": (0.3, 0.12)}


def preset_functions(name: str, x: np.ndarray) -> dict[str, np.ndarray]:
    """V, g and m0 of a preset on the grid ``x``."""
    m0 = _gaussian(x, *PRESET_CROWD[name])
    if name == "towel_beach":
        # MFG_PDE's towel-on-the-beach potential; the crowd starts in the middle
        v = 50 * (0.1 * np.cos(2 * np.pi * x) + np.cos(4 * np.pi * x) + 0.1 * np.sin(2 * np.pi * (x - np.pi / 8)))
        return {"V": v, "g": np.zeros_like(x), "m0": m0}
    if name == "lq":
        # quadratic cost around 0; the crowd starts off-centre and relaxes to the ergodic Gaussian
        return {"V": 0.5 * LQ_STIFFNESS * x**2, "g": np.zeros_like(x), "m0": m0}
    # crowd: agents pay to stand away from the exit at x = 1 and pay for company
    return {"V": 5.0 * (1 - x) ** 2, "g": 10.0 * (1 - x) ** 2, "m0": m0}


# Bounds from the numerics, shared by every MFG problem:
# - coordinates: particle positions are squared and summed over up to INT64_MAX particles (moments,
#   variances, the KDE's spread), so |x| stays below sqrt(FLOAT_MAX / INT64_MAX), with a margin of 4
#   for the sums and differences of positions;
X_LIMIT = math.sqrt(FLOAT_MAX / INT64_MAX) / 4
# - a cell keeps 20 bits of position: (x - xmin) / dx, a particle's place in its cell, is exact to
#   about 1e-6 of a cell only when dx is at least 2**20 units in the last place of the coordinates;
CELL_BITS = 20
# - a Gaussian normal draw stays below 40 in float64 (its tail beyond is below 1e-300);
LARGEST_DRAW = 40.0
# - a particle's step in one time step is at most 2**32 domain lengths: wrapping or reflecting it
#   back into the domain loses the bits above, and 52 - 32 = CELL_BITS are left for its place.
STEP_BITS = 52 - CELL_BITS


@dataclass(frozen=True)
class MFGModel:
    """The fields every MFG problem shares. Not a problem type itself.

    Scalars left as ``None`` and arrays left as ``None`` take the preset's
    values; anything given overrides the preset.
    """

    preset: str = "towel_beach"
    xmin: float | None = None
    xmax: float | None = None
    Nx: int = 51
    T: float = 1.0
    Nt: int = 50
    sigma: float | None = None
    lam: float | None = None
    congestion: str | None = None
    congestion_coef: float | None = None
    boundary: str | None = None
    N: int = 10_000
    seed: int | None = 0
    kde: str = "binned"
    bandwidth: float | str = "scott"
    V: np.ndarray | None = None
    g: np.ndarray | None = None
    m0: np.ndarray | None = None

    def __post_init__(self) -> None:
        # Fields are checked in dependency order (domain, grid, time, coefficients, particles,
        # arrays): each check uses only fields already checked, so the first error names the
        # field the user got wrong, not one derived from it.
        set_ = object.__setattr__
        set_(self, "preset", check_choice("preset", self.preset, PRESETS))
        given = {name for name in preset_defaults(self.preset) if getattr(self, name) is not None}
        for name, value in preset_defaults(self.preset).items():
            if getattr(self, name) is None:
                set_(self, name, value)
        _check_domain(self, given)
        _check_time(self)
        _check_coefficients(self, given)
        set_(self, "N", check_int("N", self.N, minimum=1))
        set_(self, "seed", check_seed("seed", self.seed))
        set_(self, "kde", check_choice("kde", self.kde, KDE_METHODS))
        if isinstance(self.bandwidth, str):
            set_(self, "bandwidth", check_choice("bandwidth", self.bandwidth, BANDWIDTH_RULES))
        else:
            _check_bandwidth(self)
        _check_functions(self, given)

    # -- the grid ------------------------------------------------------------
    @property
    def length(self) -> float:
        return self.xmax - self.xmin

    @property
    def dx(self) -> float:
        return self.length / (self.Nx if self.boundary == "periodic" else self.Nx - 1)

    @property
    def dt(self) -> float:
        return self.T / self.Nt

    @property
    def nu(self) -> float:
        return 0.5 * self.sigma**2

    @property
    def x(self) -> np.ndarray:
        return self.xmin + self.dx * np.arange(self.Nx)

    @property
    def t(self) -> np.ndarray:
        return self.dt * np.arange(self.Nt + 1)

    def weights(self) -> np.ndarray:
        return quadrature_weights(self.Nx, self.dx, self.boundary)

    def congestion_cost(self, m: np.ndarray) -> np.ndarray:
        """f(m): the running cost of crowding (log uses a floor so empty cells stay finite)."""
        if self.congestion == "none":
            return np.zeros_like(m)
        if self.congestion == "linear":
            return self.congestion_coef * m
        return self.congestion_coef * np.log(np.maximum(m, LOG_FLOOR))

    def model_fields(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(MFGModel)}


LOG_FLOOR = 1e-8


def _domain_field(given: set[str]) -> str:
    """The domain field to blame for a grid the numerics cannot hold: the one the user set (xmax if both)."""
    return "xmin" if "xmin" in given and "xmax" not in given else "xmax"


def _check_domain(model: MFGModel, given: set[str]) -> None:
    """xmin, xmax, boundary and Nx, then the grid they make."""
    set_ = object.__setattr__
    for name in ("xmin", "xmax"):
        set_(model, name, check_float(name, getattr(model, name), minimum=-X_LIMIT, maximum=X_LIMIT))
    blame = _domain_field(given)
    if model.xmax <= model.xmin:
        if blame == "xmin":  # the user moved xmin past the preset's xmax
            raise fail("xmin", model.xmin, f"must be less than xmax={model.xmax:g}")
        raise fail("xmax", model.xmax, f"must be greater than xmin={model.xmin:g}")
    set_(model, "boundary", check_choice("boundary", model.boundary, BOUNDARIES))
    set_(model, "Nx", check_int("Nx", model.Nx, minimum=3, maximum=1_000_000))
    value = getattr(model, blame)
    dx = model.dx
    # the diffusion term divides by dx**2 (and Python's ** raises where * would give inf)
    cells = "Nx" if model.boundary == "periodic" else "(Nx-1)"
    check_derived(blame, value, dx, f"the grid spacing dx=(xmax-xmin)/{cells}", low=math.sqrt(FLOAT_TINY),
                  high=math.sqrt(FLOAT_MAX))
    scale = max(abs(model.xmin), abs(model.xmax))
    if dx < 2.0**CELL_BITS * np.spacing(scale):
        raise fail(blame, value, f"the grid spacing dx={dx:.3g} is too fine for coordinates near {scale:.3g}: "
                   f"it must be at least {2.0**CELL_BITS * np.spacing(scale):.3g} (2**{CELL_BITS} float64 steps) "
                   "so that a particle's place in its cell stays exact")


def _check_time(model: MFGModel) -> None:
    set_ = object.__setattr__
    set_(model, "T", check_float("T", model.T, minimum=0, strict_minimum=True))
    set_(model, "Nt", check_int("Nt", model.Nt, minimum=1, maximum=10_000_000))
    # the implicit step divides by dt: a subnormal dt loses precision and 1/dt overflows
    check_derived("T", model.T, model.dt, "the time step dt=T/Nt", low=FLOAT_TINY)


def _check_coefficients(model: MFGModel, given: set[str]) -> None:
    """sigma, lam, congestion and its coefficient, each bounded by the terms of the scheme it enters."""
    set_ = object.__setattr__
    set_(model, "sigma", check_float("sigma", model.sigma, minimum=0))
    sigma, dx, dt = model.sigma, model.dx, model.dt
    # the implicit step's diagonal, 1/dt + sigma**2/dx**2, and a particle's largest noise step
    check_derived("sigma", sigma, 1 / dt + sigma * sigma / (dx * dx),
                  "the implicit step's diagonal 1/dt + sigma**2/dx**2")
    # the step's matrix I/dt - nu * Laplacian has a condition number of about 1 + 4 nu dt/dx**2 (the
    # Laplacian is singular on a periodic or reflecting grid: only 1/dt keeps it invertible); a tridiagonal
    # solve loses that factor of float64's 16 digits, so it stays below 1e12 to keep 4 of them
    blame = "sigma" if "sigma" in given else "T"  # the user's long horizon, not the preset's sigma
    check_derived(blame, getattr(model, blame), 1 + 2 * sigma * sigma * dt / (dx * dx),
                  "the implicit step's condition number 1 + 4*nu*dt/dx**2, nu = sigma**2/2,", high=1e12)
    check_derived(blame, getattr(model, blame), LARGEST_DRAW * sigma * math.sqrt(dt),
                  "a particle's largest noise step, 40*sigma*sqrt(dt),", high=largest_step(model))
    set_(model, "lam", check_float("lam", model.lam, minimum=0))
    # the upwind Hamiltonian's Jacobian holds lam * Dm U / dx: lam / dx**2 per unit of U
    check_derived("lam", model.lam, model.lam / (dx * dx), "the Hamiltonian's Jacobian scale lam/dx**2")
    set_(model, "congestion", check_choice("congestion", model.congestion, CONGESTION))
    set_(model, "congestion_coef", check_float("congestion_coef", model.congestion_coef, minimum=0))
    # a density of unit mass is at most 1/(dx/2) (all of it on a wall's half cell); its log at least log(LOG_FLOOR)
    largest = max(2.0 / dx, -math.log(LOG_FLOOR))
    check_derived("congestion_coef", model.congestion_coef, model.congestion_coef * largest,
                  "the largest congestion cost, congestion_coef * max(2/dx, -log 1e-8)")


def _check_bandwidth(model: MFGModel) -> None:
    h = check_float("bandwidth", model.bandwidth, minimum=0, strict_minimum=True)
    object.__setattr__(model, "bandwidth", h)
    # the kernel is sampled at integer offsets up to 6h/dx: they must be exact in float64 (2**53)
    check_derived("bandwidth", h, kde.TRUNCATION * h / model.dx, "the kernel's reach in grid points, 6*bandwidth/dx",
                  high=2.0**53)
    # the direct KDE divides by N * h * sqrt(2 pi)
    check_derived("bandwidth", h, h * model.N, "the direct KDE's normalisation N*bandwidth", low=FLOAT_TINY)


def _check_functions(model: MFGModel, given: set[str]) -> None:
    """V, g and m0: the user's arrays, or the preset's on this grid (which must be finite and hold the crowd)."""
    set_ = object.__setattr__
    defaults = preset_functions(model.preset, model.x)
    blame = _domain_field(given)
    for name in ("V", "g", "m0"):
        if getattr(model, name) is None and not np.all(np.isfinite(defaults[name])):
            raise fail(blame, getattr(model, blame), f"the preset {model.preset!r}'s {name} overflows float64 on "
                       f"[{model.xmin:g}, {model.xmax:g}]: a smaller domain, or give {name}")
    for name in ("V", "g"):
        value = defaults[name] if getattr(model, name) is None else getattr(model, name)
        set_(model, name, check_array(name, value, shape=(model.Nx,)))
    if model.m0 is None:
        if not np.sum(defaults["m0"] * model.weights()) > 0:
            centre, width = PRESET_CROWD[model.preset]
            raise fail(blame, getattr(model, blame), f"the preset {model.preset!r} starts the crowd near "
                       f"x={centre:g} (width {width:g}), which the grid of Nx={model.Nx} points on "
                       f"[{model.xmin:g}, {model.xmax:g}] misses: a domain that covers it, or give m0")
        set_(model, "m0", normalised_density("m0", defaults["m0"], model))
    else:
        set_(model, "m0", normalised_density("m0", model.m0, model))


def quadrature_weights(nx: int, dx: float, boundary: str) -> np.ndarray:
    """Weights w with sum(w * m) = integral of m: cells of dx; half cells at reflecting walls."""
    w = np.full(nx, dx)
    if boundary == "reflecting":
        w[0] = w[-1] = dx / 2
    return w


def normalised_density(field: str, value, model: MFGModel) -> np.ndarray:
    """A non-negative, finite density of the grid's length, scaled to unit mass."""
    density = check_array(field, value, shape=(model.Nx,), nonnegative=True)
    peak = float(density.max())
    if not peak > 0:
        raise fail(field, value, "must have positive mass to be normalised (all zeros)")
    # scaled to a peak of 1 first, so that the mass of huge or tiny values neither overflows nor underflows
    shape = density / peak
    normalised = shape / float(np.sum(shape * model.weights()))
    normalised.setflags(write=False)
    return normalised


def check_space_time(field: str, value, model: MFGModel, *, nonnegative: bool = False) -> np.ndarray:
    """An array on the space-time grid: shape (Nt+1, Nx)."""
    return check_array(field, value, shape=(model.Nt + 1, model.Nx), nonnegative=nonnegative)


def space_time_view(row: np.ndarray, model: MFGModel) -> np.ndarray:
    """``row`` repeated at every time level, (Nt+1, Nx), as a read-only broadcast view.

    A default field on the space-time grid costs no memory at construction:
    HJBProblem(Nx=1e5, Nt=1e5) would otherwise allocate 75 GiB before any
    estimate could refuse it. Solvers read it like any array.
    """
    return np.broadcast_to(row, (model.Nt + 1, model.Nx))


def largest_step(model: MFGModel) -> float:
    """The longest a particle may move in one time step: 2**STEP_BITS domain lengths (see STEP_BITS)."""
    return model.length * 2.0**STEP_BITS


def drives_particles_too_far(model: MFGModel, U: np.ndarray) -> bool:
    """Whether ``U``'s drift can move a particle further than :func:`largest_step` (or is not finite)."""
    return not drift_bound(model, U) * model.dt <= largest_step(model)


def drift_bound(model: MFGModel, U: np.ndarray) -> float:
    """A bound on the particles' drift ``-lam * dU/dx``: ``lam * (max U - min U) / dx``.

    Inf or NaN where U is not finite; Python floats, so an overflow gives inf rather than an exception.
    """
    return model.lam * (float(np.max(U)) - float(np.min(U))) / model.dx


@dataclass(frozen=True)
class FPProblem(MFGModel):
    """Forward Fokker-Planck by particles, given the value function ``U`` (Nt+1, Nx).

    ``U`` defaults to zero: free diffusion from ``m0`` (the fixed point and
    common noise pass the HJB solution).
    """

    U: np.ndarray | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.U is None:  # zero everywhere, as a read-only view: no (Nt+1, Nx) array is allocated
            object.__setattr__(self, "U", space_time_view(np.zeros(1), self))
        else:
            u = check_space_time("U", self.U, self)
            check_derived("U", self.U, drift_bound(self, u) * self.dt,
                          "a particle's largest drift step, lam*(max U - min U)/dx*dt,", high=largest_step(self))
            object.__setattr__(self, "U", u)


@dataclass(frozen=True)
class HJBProblem(MFGModel):
    """Backward HJB by implicit finite differences, given the density ``M`` (Nt+1, Nx).

    ``M`` defaults to ``m0`` at every time. ``V`` may also be given per time
    step as ``V_t`` (Nt+1, Nx), which common noise uses to shift the potential.
    """

    M: np.ndarray | None = None
    V_t: np.ndarray | None = None
    newton_tol: float = 1e-10
    newton_max: int = 30

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.M is None:  # m0 at every time, as a read-only view of m0: nothing (Nt+1, Nx) is allocated
            object.__setattr__(self, "M", space_time_view(self.m0, self))
        else:
            object.__setattr__(self, "M", check_space_time("M", self.M, self, nonnegative=True))
        if self.V_t is not None:
            object.__setattr__(self, "V_t", check_space_time("V_t", self.V_t, self))
        object.__setattr__(self, "newton_tol", check_float("newton_tol", self.newton_tol, minimum=0,
                                                           strict_minimum=True))
        # the kernels count Newton iterations in int64 and loop to newton_max + 1
        object.__setattr__(self, "newton_max", check_int("newton_max", self.newton_max, minimum=1,
                                                         maximum=INT64_MAX - 1))

    def potential(self) -> np.ndarray:
        """V on the space-time grid (Nt+1, Nx)."""
        return np.tile(self.V, (self.Nt + 1, 1)) if self.V_t is None else self.V_t


@dataclass(frozen=True)
class MFGProblem(MFGModel):
    """The coupled MFG: damped Picard iteration between HJB and FP.

    ``damping_U`` and ``damping_M`` are the weights of the new iterate;
    convergence needs both the relative and the absolute L2 change of U and M
    below ``rtol`` and ``atol``.
    """

    damping_U: float = 0.5
    damping_M: float = 0.5
    max_iter: int = 60
    rtol: float = 1e-3
    atol: float = 1e-4

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("damping_U", "damping_M"):
            object.__setattr__(self, name, check_float(name, getattr(self, name), minimum=0, strict_minimum=True,
                                                       maximum=1))
        object.__setattr__(self, "max_iter", check_int("max_iter", self.max_iter, minimum=1))
        object.__setattr__(self, "rtol", check_float("rtol", self.rtol, minimum=0))
        object.__setattr__(self, "atol", check_float("atol", self.atol, minimum=0))


@dataclass(frozen=True)
class CommonNoiseProblem(MFGProblem):
    """K conditional MFG solves along Ornstein-Uhlenbeck common-noise paths.

    The path ``theta(t)`` (``d theta = -kappa theta dt + noise dW``, theta(0)=0)
    shifts the potential: ``V(t, x) = V(x - theta(t))``, periodic or clamped
    at the walls. ``quantiles`` summarise U and M across paths.
    """

    K: int = 16
    kappa: float = 1.0
    noise: float = 0.1
    quantiles: tuple = (0.05, 0.5, 0.95)

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "K", check_int("K", self.K, minimum=1))
        object.__setattr__(self, "kappa", check_float("kappa", self.kappa, minimum=0))
        object.__setattr__(self, "noise", check_float("noise", self.noise, minimum=0))
        # a path's largest excursion, noise * sqrt(T) times the largest draw, shifts the potential's argument
        check_derived("noise", self.noise, LARGEST_DRAW * self.noise * math.sqrt(self.T) + X_LIMIT,
                      "the common noise's largest shift, 40*noise*sqrt(T)")
        q = check_array("quantiles", self.quantiles, ndim=1)
        if q.size == 0 or np.any((q < 0) | (q > 1)):
            raise fail("quantiles", self.quantiles, "must be numbers in [0, 1]")
        object.__setattr__(self, "quantiles", tuple(float(v) for v in q))

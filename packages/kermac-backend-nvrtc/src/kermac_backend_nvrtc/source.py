"""Variant → CUDA C++ source: the kernel files of `cuda/` behind a short generated header.

Every kernel is one translation unit, compiled by one NVRTC call:

1. a generated *configuration*: the compute type `km_t`, the tile and route `#define`s, and the
   kernel's interface as macros — `KM_PARAMS` (the parameter list), `KM_HYPER_FORMALS` /
   `KM_HYPER_ACTUALS` (the hyperparameters passed to the functors), `KM_HYPER_LOADS` and
   `KM_BATCH_OFFSETS` (statements run once per block for its batch entry), `KM_DIAG(m, n)`;
2. the library parts the route needs (`prelude.cuh`, `loader.cuh`, tensor-core helpers);
3. the generated *functors*: one-line device functions returning the IR's expressions
   (`km_inner`, `km_reduce` (the reduction's combine, `kermac.reductions`), `km_epilogue`,
   `km_multiply` (a gradient program's product-form factor), `km_term` and `km_accumulate` (the
   SIMT gradient's per-term and per-output steps); `.render`);
4. the route's kernel file.

`#include "name.cuh"` lines of the package files are expanded in place here, so the
text NVRTC compiles — and the JIT cache key hashes — is the whole kernel.  `kernel_source` returns
it with the kernel's parameters in order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

from kermac.programs import nonnegative_variables, product_factor, zero_padding_is_neutral
from kermac.reductions import ALL as REDUCTIONS
from kermac_backend_nvrtc import tiles, variants
from kermac_backend_nvrtc.render import cuda_constant, hyper_identifier, is_sign_product, render_expr, split_exponent

__all__ = ["EXP2_COEFFS", "Param", "kernel_file", "kernel_source"]

EXP2_COEFFS = (0.9999992847442627, 0.6931217908859253, 0.240247443318367, 0.05591785907745361, 0.009570101276040077)
"""2^r on [−0.5, 0.5], relative minimax of degree 4 (float32 Horner: max 2.7e-6, mean 4e-8), for the
split kernels' `km_powabs_split` (`cuda/pow_split.cuh`).
"""

_INCLUDE = re.compile(r'^#include "([\w.]+)"$', re.MULTILINE)


@dataclass(frozen=True)
class Param:
    """One kernel parameter: its name and C type (a `*` type is a device pointer)."""

    name: str
    ctype: str

    @property
    def decl(self) -> str:
        restrict = " __restrict__" if self.ctype.endswith("*") else ""
        return f"{self.ctype}{restrict} {self.name}"


@cache
def kernel_file(name: str) -> str:
    """The text of package file `cuda/<name>` with its `#include "..."` lines expanded."""
    text = resources.files("kermac_backend_nvrtc").joinpath("cuda", name).read_text(encoding="utf-8")
    return _INCLUDE.sub(lambda m: kernel_file(m.group(1)).rstrip("\n"), text)


def _defines(values: dict[str, object]) -> list[str]:
    return [f"#define {name} {value}".rstrip() for name, value in values.items()]


def _assemble(
    compute: str,
    parts: list[str],
    config: dict[str, object],
    functors: list[str],
    kernel: str,
    part_config: dict[str, object] | None = None,
) -> str:
    """The compute type, `part_config` (macros the library parts read), the library `parts`, the
    variant's `config` macros (after the parts: names such as `NT` are template parameters there),
    the generated `functors` and the kernel file."""
    head = [f"typedef {compute} km_t;", *_defines(part_config or {})]
    return "\n".join([*head, *map(kernel_file, parts), *_defines(config), *functors, kernel_file(kernel)])


def _interface(
    hypers: tuple[str, ...], tensor_hypers: dict[str, str], operands: list[str], batch_dims: int
) -> tuple[list[Param], list[Param], dict[str, str]]:
    """What every kernel takes from its hyperparameters and batch dimensions: the hyperparameter and
    batch-stride parameters, and the macros passing and loading them (`operands` name the pointers
    that move per batch entry; a tensor hyperparameter moves too, as `h_<name>`).

    A number is a `km_t` argument `hv_<name>`; a tensor a pointer `hp_<name>` read at the batch
    entry's offset `off_h_<name>`.  The batch entry `bidx` is decoded innermost dimension first:
    per dimension `i` (size `bs<i>`), its index adds `index · b<operand><i>` to each offset."""
    operands = list(operands)
    hyper_params, loads = [], []
    for h in hypers:
        if h in tensor_hypers:
            hyper_params.append(Param(f"hp_{h}", f"const {tensor_hypers[h]}*"))
            loads.append(f"const km_t {hyper_identifier(h)} = km_cvt(hp_{h}[off_{hyper_identifier(h)}], km_t(0));")
            operands.append(hyper_identifier(h))
        else:
            hyper_params.append(Param(f"hv_{h}", "km_t"))
            loads.append(f"const km_t {hyper_identifier(h)} = hv_{h};")
    batch_params = []
    offsets = [f"long long {', '.join(f'off_{o} = 0' for o in operands)};"]
    if batch_dims:
        offsets.append("{ long long r = bidx; long long q;")
        for i in reversed(range(batch_dims)):
            batch_params.append(Param(f"bs{i}", "long long"))
            offsets.append(f"q = r % bs{i}; r /= bs{i};")
            for o in operands:
                batch_params.append(Param(f"b{o}{i}", "long long"))
                offsets.append(f"off_{o} += q * b{o}{i};")
        offsets.append("}")
    macros = {
        "KM_HYPER_FORMALS": "".join(f", km_t {hyper_identifier(h)}" for h in hypers),
        "KM_HYPER_ACTUALS": "".join(f", {hyper_identifier(h)}" for h in hypers),
        "KM_HYPER_LOADS": " ".join(loads),
        "KM_BATCH_OFFSETS": " ".join(offsets),
    }
    return hyper_params, batch_params, macros


def _render_options(v: variants.KernelVariant, **facts: object) -> dict:
    """render_expr's arguments for variant `v`: compute type, half powers, hyperparameter facts."""
    fixed = dict(v.fixed_hypers)
    return {"compute": v.compute, "half_powers": v.half_powers, "known": fixed, "ge1": v.hypers_at_least_one, **facts}


_PAIRWISE_NAMES = {n: n for n in ("x", "z", "acc", "diag")}
"""C names of the pairwise IR variables (the functors' parameters)."""


def _loads(**operands: variants.TileLoad) -> dict[str, int]:
    """`KM_<operand>_MODE` / `KM_<operand>_VEC`: the loader's template arguments per operand."""
    out = {}
    for name, load in operands.items():
        out |= {f"KM_{name.upper()}_MODE": int(load.mode), f"KM_{name.upper()}_VEC": load.count}
    return out


def _pairwise_interface(
    v: variants.KernelVariant, tin: str, extra: list[Param], *, product: bool = False
) -> tuple[list[Param], dict[str, object]]:
    """Parameters of a pairwise kernel in order — operands, sizes and strides, `extra`, the diagonal
    shift if the epilogue reads `diag`, batch strides, hyperparameters — and the configuration every
    pairwise route shares (interface macros and the diagonal indicator `KM_DIAG(m, n)`).

    A `product` kernel also reads `v` (after z; its batch entry moves it as `off_v`), knows the columns
    `C` and the row tiles `tiles_m` in place of `tiles_n`, and strides `svn`, `svc` of v and `som`,
    `soc` of out."""
    prog = v.program
    operands = ["x", "z", "v", "o"] if product else ["x", "z", "o"]
    hyper_params, batch_params, macros = _interface(prog.hypers, dict(v.tensor_hypers), operands, v.batch_dims)
    params = [Param("x", f"const {tin}*"), Param("z", f"const {tin}*")]
    params += [Param("v", f"const {tin}*")] if product else []
    params.append(Param("out", f"{tin}*"))
    params += [Param(n, "int") for n in (("M", "N", "D", "C", "tiles_m") if product else ("M", "N", "D", "tiles_n"))]
    strides = ("svn", "svc", "som", "soc") if product else ("som", "son")
    params += [Param(n, "long long") for n in ("zbase", "sxm", "sxk", "szn", "szk", *strides)]
    params += extra
    if prog.uses_diag:
        params.append(Param("diag_shift", "long long"))
    params += batch_params + hyper_params
    diag = "((long long)(m) + diag_shift == (long long)(n) ? km_t(1) : km_t(0))" if prog.uses_diag else "km_t(0)"
    return params, {"KM_PARAMS": ", ".join(p.decl for p in params), **macros, "KM_DIAG(m, n)": diag}


def _epilogue_functor(v: variants.KernelVariant, inline: str = "__forceinline__") -> str:
    options = _render_options(v, nonneg=nonnegative_variables(v.program))
    text = render_expr(v.program.epilogue, _PAIRWISE_NAMES, **options)
    return f"__device__ {inline} km_t km_epilogue(km_t acc, km_t diag KM_HYPER_FORMALS) {{ return {text}; }}"


def _reduce_functor(reduction: str, compute: str, call: bool = False) -> str:
    """`km_reduce(acc, v)`: the combine `acc ⊕ v` of reduction `reduction` (`kermac.reductions`) in `compute`;
    a called function with `call` (the variant's `call_combine`), else inlined."""
    combine = render_expr(REDUCTIONS[reduction].combine, {"acc": "acc", "t": "v"}, compute=compute)
    inline = "__noinline__" if call else "__forceinline__"
    return f"__device__ {inline} km_t km_reduce(km_t acc, km_t v) {{ return {combine}; }}"


def _horner(coeffs: tuple[float, ...], x: str) -> str:
    text = f"{coeffs[-1]!r}f"
    for c in reversed(coeffs[:-1]):
        text = f"fmaf({text}, {x}, {c!r}f)"
    return text


def _simt_parts(
    v: variants.SimtPairwise | variants.SplitPowerPairwise | variants.KContiguousPairwise | variants.SimtProduct,
    cfg: tiles.PairwiseConfig,
    split: variants.Ex2Polynomial | variants.PowerTable | None = None,
) -> tuple[dict[str, object], dict[str, object] | None, list[str]]:
    """What a kernel running the SIMT pairwise main loop (`cuda/simt_mainloop.cuh`) on tile `cfg` needs
    besides its interface: the tile and route macros, the macros the library parts read (`None`
    without a `split` power) and the functors km_inner, km_reduce and km_epilogue."""
    prog = v.program
    tin, compute = variants.INPUT_TYPES[v.dtype]
    names = _PAIRWISE_NAMES
    degree = split.degree if isinstance(split, variants.PowerTable) else 0
    flush = getattr(v, "flush_subnormals", False)
    deep_k, padded_tail = getattr(v, "deep_k", False), getattr(v, "padded_tail", False)
    loads_at = tiles.DEEP_K_LOADS_AT if deep_k else 0
    if padded_tail and not zero_padding_is_neutral(prog):  # the padding's terms must add nothing
        raise ValueError(
            f"padded tail: needs an inner term whose value at x = z = 0 is the reduction's identity; got {prog.key()}"
        )
    if padded_tail and not 0 <= loads_at < cfg.bk:
        raise ValueError(f"DEEP_K_LOADS_AT: expected 0 <= steps < {cfg.bk} (the k tile's depth), got {loads_at}")
    config = {
        "NT": 256,
        **{k.upper(): getattr(cfg, k) for k in ("bm", "bn", "bk", "vm", "vn", "tn", "gm", "gn", "spad")},
        "KM_MIN_BLOCKS": cfg.min_blocks,
        "KM_SPLIT_PAIRS": split.pairs if split else 0,
        "KM_PADDED_TAIL": int(padded_tail),
        "KM_LOADS_AFTER": loads_at,
        "KM_POW_TABLE": int(degree > 0),
        "KM_POW_DEGREE": degree,
        "KM_POW_COEFFS": ", ".join(f"pc{j}" for j in range(degree + 1)) if degree else "",
        "KM_K_CONTIGUOUS": int(isinstance(v, variants.KContiguousPairwise)),
        "KM_K_UNROLL": getattr(v, "k_unroll", cfg.bk),
        "KM_IDENTITY": cuda_constant(prog.identity, compute),
        "KM_SPLIT_EXPONENT": "",
    }
    part_config = None
    if split:  # |x − z|^b: b, and what cuda/pow_split.cuh reads
        exponent = split_exponent(prog, v.hypers_at_least_one)
        if compute != "float" or exponent is None:
            raise ValueError(f"split power: needs a float sum of |x - z|^b with b >= 1; got {compute} {prog.key()}")
        config["KM_SPLIT_EXPONENT"] = render_expr(exponent, names, compute=compute)
        part_config = {
            "KM_SPLIT_LG2": "km_lg2_ftz" if flush else "km_lg2",
            "KM_EXP2_POLY(r)": _horner(EXP2_COEFFS, "r"),
        }
    inner = render_expr(prog.inner, names, **_render_options(v, ftz=flush))
    functors = [
        f"typedef {tin} km_in_t;",
        f"__device__ __forceinline__ km_t km_inner(km_t x, km_t z KM_HYPER_FORMALS) {{ return {inner}; }}",
        _reduce_functor(prog.reduction, compute, getattr(v, "call_combine", False)),
        _epilogue_functor(v),
    ]
    return config, part_config, functors


def _simt_pairwise_source(
    v: variants.SimtPairwise | variants.SplitPowerPairwise | variants.KContiguousPairwise,
    cfg: tiles.PairwiseConfig,
    loads: dict[str, int],
    split: variants.Ex2Polynomial | variants.PowerTable | None = None,
) -> tuple[str, list[Param]]:
    """The SIMT pairwise kernel (`cuda/simt_pairwise.cuh`) on tile `cfg` with operand `loads`."""
    tin, compute = variants.INPUT_TYPES[v.dtype]
    degree = split.degree if isinstance(split, variants.PowerTable) else 0
    table = [Param(f"pc{j}", "km_t") for j in range(degree + 1)] if degree else []
    params, shared = _pairwise_interface(v, tin, [Param("ovec", "int"), *table])
    config, part_config, functors = _simt_parts(v, cfg, split)
    parts = ["prelude.cuh", *(["pow_split.cuh"] if split else []), "loader.cuh"]
    return _assemble(compute, parts, config | shared | loads, functors, "simt_pairwise.cuh", part_config), params


def _simt_product_source(v: variants.SimtProduct) -> tuple[str, list[Param]]:
    """The fused SIMT kernel product (`cuda/simt_product.cuh`): the SIMT pairwise main loop on the tile
    `tiles.product_config`, its K tiles contracted with `v.cc` columns of v per block."""
    tin, compute = variants.INPUT_TYPES[v.dtype]
    params, shared = _pairwise_interface(v, tin, [], product=True)
    config, _, functors = _simt_parts(v, tiles.product_config(compute, v.cc))
    config |= {"CC": v.cc, **shared, **_loads(x=v.x, z=v.z, v=v.v)}
    return _assemble(compute, ["prelude.cuh", "loader.cuh"], config, functors, "simt_product.cuh"), params


def _tensor_core_pairwise_source(v: variants.MmaPairwise | variants.WgmmaPairwise) -> tuple[str, list[Param]]:
    """A float32 (x − z)²-sum variant on `mma.sync` or `wgmma`."""
    params, config = _pairwise_interface(v, "float", [Param("guard", "km_t"), Param("ovec", "int")])
    config |= _loads(x=v.x, z=v.z)
    wgmma = isinstance(v, variants.WgmmaPairwise)
    if not wgmma:
        cfg = tiles.TC_CONFIG
        config |= {"NT": 256, "BM": cfg.bm, "BN": cfg.bn, "BK": cfg.bk, "SPAD": cfg.spad}
        config |= {"KM_MIN_BLOCKS": cfg.min_blocks}
    functors = [_epilogue_functor(v, "__noinline__" if v.call_epilogue else "__forceinline__")]
    parts = ["prelude.cuh", "loader.cuh", "mma_tf32.cuh", *(["wgmma_sync.cuh", "wgmma_tf32.cuh"] if wgmma else [])]
    return _assemble("float", parts, config, functors, "wgmma_pairwise.cuh" if wgmma else "mma_pairwise.cuh"), params


def _grad_interface(
    v: variants.SimtGrad | variants.MmaGrad | variants.SignGrad, tin: str, tiles: str
) -> tuple[list[Param], dict[str, object]]:
    """Parameters (in order) of a gradient kernel and its shared configuration.

    Parameters: operands a, b, c, d, out; sizes M, N, O, K; `tiles` (the tile count along the
    grid's fastest dimension: `tiles_m` or `tiles_n`); `ochunks`; `zbase`; the strides; batch
    strides; hyperparameters.
    """
    prog = v.program
    operands = ["a", "b", "c", "d", "o"]
    hyper_params, batch_params, macros = _interface(prog.hypers, dict(v.tensor_hypers), operands, v.batch_dims)
    params = [Param(n, f"const {tin}*") for n in ("a", "b", "c", "d")]
    params += [Param("out", f"{tin}*"), *(Param(n, "int") for n in ("M", "N", "O", "K", tiles, "ochunks"))]
    strides = ("zbase", "sak", "sam", "sbn", "sbk", "sco", "sck", "sdn", "sdm", "soo", "son", "som")
    params += [Param(n, "long long") for n in strides]
    params += batch_params + hyper_params
    return params, {"KM_PARAMS": ", ".join(p.decl for p in params), **macros}


_GRAD_NAMES = {n: n for n in ("a", "b", "c", "d", "term", "acc")}
"""C names of the gradient IR variables (the functors' parameters)."""


def _grad_epilogue_functor(v: variants.SimtGrad | variants.MmaGrad | variants.SignGrad, options: dict) -> str:
    epilogue = render_expr(v.program.epilogue, _GRAD_NAMES, **options)
    return f"__device__ __forceinline__ km_t km_epilogue(km_t acc KM_HYPER_FORMALS) {{ return {epilogue}; }}"


def _multiply_functor(v: variants.SimtGrad | variants.MmaGrad, options: dict) -> str:
    """`km_multiply(d, b)`: the factor `g(d, b)` of a program in the product form `Σ_k c·a·g(d, b)`
    (`kermac.programs.product_factor`); a program without one is refused."""
    factor = product_factor(v.program)
    if factor is None:
        raise ValueError(
            f"{type(v).__name__}: needs a gradient program in the product form (sum of c·a·g(d, b)); "
            f"got {v.program.key()}"
        )
    multiply = render_expr(factor, _GRAD_NAMES, **options)
    return f"__device__ __forceinline__ km_t km_multiply(km_t d, km_t b KM_HYPER_FORMALS) {{ return {multiply}; }}"


def _simt_grad_functors(v: variants.SimtGrad, compute: str, options: dict) -> list[str]:
    """The functors `cuda/simt_grad.cuh` reads: `km_term(a, b, d)` (evaluated once per (n, m, k)),
    `km_accumulate(acc, c, term)` (once per o: the value so far combined with the term's contribution)
    and `km_epilogue`.

    A program with a factor `g` (`kermac.programs.product_factor`) is the product form: `a·g(d, b)` and
    the FMA `c·term + acc`; another is the general form: its multiply over `a, b, d`, and its accumulate
    over `c` and `term` combined by its reduction's `km_reduce` (`kermac.reductions`)."""
    prog = v.program
    formals = "KM_HYPER_FORMALS"
    term_head = f"__device__ __forceinline__ km_t km_term(km_t a, km_t b, km_t d {formals})"
    accumulate_head = f"__device__ __forceinline__ km_t km_accumulate(km_t acc, km_t c, km_t term {formals})"
    if product_factor(prog) is not None:
        return [
            _multiply_functor(v, options),
            f"{term_head} {{ return a * km_multiply(d, b KM_HYPER_ACTUALS); }}",
            f"{accumulate_head} {{ return km_fma(c, term, acc); }}",
            _grad_epilogue_functor(v, options),
        ]
    term = render_expr(prog.multiply, _GRAD_NAMES, **options)
    contribution = render_expr(prog.accumulate, _GRAD_NAMES, **options)
    return [
        _reduce_functor(prog.reduction, compute, v.call_combine),
        f"{term_head} {{ return {term}; }}",
        f"{accumulate_head} {{ return km_reduce(acc, {contribution}); }}",
        _grad_epilogue_functor(v, options),
    ]


def _simt_grad_source(v: variants.SimtGrad) -> tuple[str, list[Param]]:
    """The SIMT gradient kernel (`cuda/simt_grad.cuh`): every gradient program, in either form."""
    tin, compute = variants.INPUT_TYPES[v.dtype]
    cfg = tiles.grad_config(compute)
    params, shared = _grad_interface(v, tin, "tiles_m")
    config = {
        "NT": 256,
        **{k.upper(): getattr(cfg, k) for k in ("bmm", "bnn", "bk", "tpm", "tpn")},
        "OT": v.ot,
        "SPAD": cfg.spad,
        "KM_MIN_BLOCKS": cfg.min_blocks,
        "KM_K_UNROLL": v.k_unroll,
        "KM_IDENTITY": cuda_constant(v.program.identity, compute),
        **shared,
        **_loads(a=v.a, b=v.b, c=v.c),
    }
    functors = [f"typedef {tin} km_in_t;", *_simt_grad_functors(v, compute, _render_options(v, ftz=v.flush_subnormals))]
    return _assemble(compute, ["prelude.cuh", "loader.cuh"], config, functors, "simt_grad.cuh"), params


def _mma_grad_source(v: variants.MmaGrad) -> tuple[str, list[Param]]:
    """The float32 gradient on `mma.sync` with the tile `.tiles.TC_GRAD_CONFIG`."""
    cfg = tiles.TC_GRAD_CONFIG
    params, shared = _grad_interface(v, "float", "tiles_n")
    options = _render_options(v, ftz=v.flush_subnormals, gt1=v.hypers_above_one)
    functors = [_multiply_functor(v, options), _grad_epilogue_functor(v, options)]
    config = {
        "NT": 256,
        "WARPS_M": cfg.warps_m,
        "WN": cfg.wn,
        "WM": cfg.wm,
        "OT8": v.eights,
        "BNN": cfg.bnn,
        "BMM": cfg.bmm,
        "BK": cfg.bk,
        "AS": tiles.smem_stride(cfg.bmm),
        "BS": tiles.smem_stride(cfg.bnn),
        "CS": tiles.smem_stride(v.ot),
        "KG": cfg.k_group,
        "KM_K_UNROLL": cfg.k_unroll,
        "KM_MIN_BLOCKS": cfg.min_blocks,
        **shared,
        **_loads(a=v.a, b=v.b, c=v.c),
    }
    parts = ["prelude.cuh", "loader.cuh", "mma_tf32.cuh"]
    return _assemble("float", parts, config, functors, "mma_grad.cuh"), params


def _wgmma_bf16(n: int) -> str:
    """`km_wgmma`: d[0..n/2) (+)= A·B, one m64{n}k16 bf16 wgmma, A from registers, B the shared-memory
    descriptor whose low word is `b` (the high word is `KM_DESC_HI`): its operand lists depend on n."""
    nacc = n // 2
    acc = ", ".join(f"%{i}" for i in range(nacc))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(nacc))
    a_op = ", ".join(f"%{nacc + i}" for i in range(4))
    return (
        "__device__ __forceinline__ void km_wgmma(float* d, const unsigned* a, unsigned b, int accumulate) {\n"
        '  asm volatile("{\\n.reg .pred p;\\n.reg .b64 bd;\\n"\n'
        f'      "mov.b64 bd, {{%{nacc + 4}, %{nacc + 5}}};\\nsetp.ne.b32 p, %{nacc + 6}, 0;\\n"\n'
        f'      "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 "\n'
        f'      "{{{acc}}}, {{{a_op}}}, bd, p, 1, 1, 0;\\n}}\\n"\n'
        f"      : {outs}\n"
        '      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b), "r"(KM_DESC_HI), "r"(accumulate));\n'
        "}"
    )


def _sign_grad_source(v: variants.SignGrad) -> tuple[str, list[Param]]:
    """The float32 sign(d − b) gradient as the bf16 sign product (`cuda/sign_grad.cuh`); its parameters
    are `_grad_interface`'s, then `bvec` (b's tile rows can be copied 16 bytes at a time) and
    `ovec` (8-byte stores of 2 consecutive m)."""
    if not is_sign_product(v.program):  # the kernel computes sign(d − b) itself: no km_multiply
        raise ValueError(
            f"sign-product gradient: needs the product form with the factor sign(d - b); got {v.program.key()}"
        )
    tile = tiles.SIGN_GRAD_TILE
    params, shared = _grad_interface(v, "float", "tiles_n")
    config = {
        "NT": tile.threads,
        "OT": v.ot,
        "MB": tile.mb,
        "MW": tile.mw,
        "BNN": tile.bnn,
        "BK": tile.bk,
        "BS": tile.bs,
        "ACS": tile.acs,
        **shared,
    }
    parts = ["prelude.cuh", "loader.cuh", "wgmma_sync.cuh", "sign_grad_helpers.cuh"]
    functors = [_wgmma_bf16(3 * v.ot), _grad_epilogue_functor(v, _render_options(v))]
    source = _assemble("float", parts, config, functors, "sign_grad.cuh")
    return source, [*params, Param("bvec", "int"), Param("ovec", "int")]


def kernel_source(v: variants.KernelVariant) -> tuple[str, list[Param]]:
    """CUDA source of variant `v`'s kernel (named `v.kernel`) and its parameters in order."""
    if isinstance(v, variants.SimtPairwise):
        return _simt_pairwise_source(v, tiles.pairwise_config(v.compute, v.deep_k), _loads(x=v.x, z=v.z))
    if isinstance(v, variants.SplitPowerPairwise):
        return _simt_pairwise_source(v, tiles.pairwise_config(v.compute), _loads(x=v.x, z=v.z), v.split)
    if isinstance(v, variants.KContiguousPairwise):
        return _simt_pairwise_source(v, tiles.KCONTIG_CONFIG, {})
    if isinstance(v, variants.MmaPairwise | variants.WgmmaPairwise):
        return _tensor_core_pairwise_source(v)
    if isinstance(v, variants.SimtProduct):
        return _simt_product_source(v)
    if isinstance(v, variants.SimtGrad):
        return _simt_grad_source(v)
    if isinstance(v, variants.MmaGrad):
        return _mma_grad_source(v)
    if isinstance(v, variants.SignGrad):
        return _sign_grad_source(v)
    raise TypeError(f"variant: expected a kernel variant of kermac_backend_nvrtc.variants, got {type(v).__name__}")

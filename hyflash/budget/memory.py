"""The memory model: every term of an on-device budget, separately, with its formula.

Each term has what the bundle stores (``stored``: file bytes) and what the running app
holds (``resident``: RAM), because runtimes differ exactly there: ONNX Runtime memory-maps
a shared embedding table (only the rows a gather touches become resident) but prepacks a
private copy of every MatMul weight per session; ExecuTorch keeps the program's data and
XNNPACK packs the delegated weights once more (``runtime_costs``). The resident total is
what the device verdict compares with the app's limit.

Terms (T: target, D: drafter, recipe formats from ``recipes``):

- target layers: the projections in the recipe's format + norms/biases (float32) + rope
  tables; resident x the runtime's weights factor;
- embedding: V x H in the embedding format (ONNX: memory-mapped, ~0 resident);
- LM head: V x H in the LM head format when stored as its own matrix; resident once per
  graph that scores with it (ONNX: the target's session, and the drafter's when it scores
  the full vocabulary: two copies);
- KV cache: 2 x layers x kv_heads x head_dim x bytes x context (sliding-window layers keep
  at most their window), a static buffer: allocated for the whole context;
- drafter weights, its draft-vocabulary head (Vd x H), and its state: window + memory,
  fixed for HyFlash, the whole context for the full-context drafter; a call's state is
  input and output at once (x2) plus the commit buffer of feature rows;
- activations: the larger of a prefill chunk (P rows: logits P x V, features, one layer's
  scratch, attention scores heads x P x P) and a verify block (B rows of the same, plus
  the drafter's B-1 logits rows), float32;
- runtime: the library and a session (phone) or the whole Python process (desktop);
- load transient: extra peak while the largest graph loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hyflash.budget.recipes import Recipe
from hyflash.budget.runtime_costs import MIB, RuntimeCosts
from hyflash.budget.shapes import DrafterShape, TargetShape

F32 = 4
SHARE_MIN = 4096  # bytes: graphs keep smaller initializers inline, each its own copy
# (hyflash.export.shared_weights.MIN_BYTES; a test pins the two together)
FOLD_LIMIT = 8192  # elements: torch.onnx's constant folder (onnxscript) transposes a weight
# that two nodes use only up to this size (DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT; pinned)


@dataclass(frozen=True)
class Plan:
    """What is sized: the pair, how it is stored, and how it runs."""

    target: TargetShape
    drafter: DrafterShape | None
    recipe: Recipe
    context: int  # positions the static KV cache (and a full-context window) holds
    prefill: int  # rows of one prefill call
    runtime: RuntimeCosts
    desktop: bool = False  # the runtime term is the Python process (--measure)
    kv_positions: int | None = None  # positions actually written (default: context)
    embedding_mapped: bool | None = None  # None: the runtime's default
    commit_rows: int | None = None  # feature rows a drafter call takes (default: B)
    kv_form: str | None = None  # a bundle's kv_cache.form (default: what export would pick)
    drafter_recipe: Recipe | None = None  # a bundle that quantized one model only (default:
    # the drafter is stored as ``recipe``)

    @property
    def draft_recipe(self) -> Recipe:
        """How the drafter's weights are stored: ``drafter_recipe``, else ``recipe``."""
        return self.drafter_recipe or self.recipe

    def recipe_name(self) -> str:
        """``int4``, or for a bundle that quantized one model only ``fp32 target + int4
        drafter``."""
        if self.draft_recipe.name == self.recipe.name:
            return self.recipe.name
        return f"{self.recipe.name} target + {self.draft_recipe.name} drafter"


@dataclass(frozen=True)
class Term:
    key: str
    label: str
    stored: int
    resident: int
    formula: str
    grows: bool = False  # with the context


NOT_TOGETHER = ("load", "activations", "run")  # loading's peak vs the calls' (Budget.resident)


@dataclass(frozen=True)
class Budget:
    plan: Plan
    terms: list[Term] = field(default_factory=list)

    @property
    def resident(self) -> int:
        """The peak: every term, except that loading's transient buffers and a call's
        activations never coincide (the graphs load before the first call), so only the
        larger of the two counts."""
        apart = {t.key: t.resident for t in self.terms if t.key in NOT_TOGETHER}
        rest = sum(t.resident for t in self.terms if t.key not in NOT_TOGETHER)
        calls = apart.get("activations", 0) + apart.get("run", 0)
        return rest + max(apart.get("load", 0), calls)

    @property
    def stored(self) -> int:
        return sum(t.stored for t in self.terms)

    def term(self, key: str) -> Term:
        return next(t for t in self.terms if t.key == key)


def mib(n: float) -> str:
    return f"{n / MIB:.1f} MiB"


# ------------------------------------------------------------------ target


def target_layers(p: Plan) -> Term:
    t, r = p.target, p.recipe
    linear = sum(r.linear.bytes(m.rows, m.cols, m.count) for m in t.linears())
    rope = rope_bytes(p)
    stored = linear + t.small_params * F32 + rope
    f = p.runtime.factor(r.name)
    per_layer = " + ".join(f"{m.name} {m.rows}x{m.cols}" for m in t.linears())
    return Term("target.layers", "target layers", stored, round(stored * f),
                f"{t.layers} x ({per_layer}) as {r.linear.describe()} = {mib(linear)}; + norms/"
                f"biases {t.small_params} x 4 B + rope tables {mib(rope)}; resident x {f:.2f} "
                f"({p.runtime.backend} {r.name} weights factor, {p.runtime.source})")


def rope_bytes(p: Plan) -> int:
    """cos/sin tables over the context: the lean ONNX graph keeps half of each row (its
    fused rotary kernel's layout), the optimum graph and ExecuTorch Target's whole
    [context, head_dim] buffers. Export picks the lean graph when head_dim % 16 == 0."""
    half = p.runtime.backend == "onnx" and target_form(p) == "in_place"
    return 2 * p.context * (p.target.head_dim // 2 if half else p.target.head_dim) * F32


def target_form(p: Plan) -> str:
    return p.kv_form or ("in_place" if p.target.head_dim % 16 == 0 else "past_present")


def embedding(p: Plan) -> Term:
    t, r = p.target, p.recipe
    stored = r.embedding.bytes(t.vocab, t.hidden)
    how = ("a memory-mapped shared file: its pages become resident as gathers touch rows, "
           "and the kernel's fault-around makes that most of the table within a few hundred "
           "tokens (measured: 92 of 108 MiB after 300 random tokens, SmolLM2); clean pages "
           "the OS can drop under pressure" if mapped(p) else "loaded with the program")
    return Term("target.embedding", "token embedding", stored, stored,
                f"V x H = {t.vocab} x {t.hidden} as {r.embedding.describe()} = {mib(stored)}; "
                f"{how}")


def mapped(p: Plan) -> bool:
    """The embedding table is a memory-mapped file (ONNX shared weights), not loaded."""
    return p.runtime.embedding_mapped if p.embedding_mapped is None else p.embedding_mapped


def head_copies(p: Plan) -> int:
    """Graphs holding their own resident copy of the LM head: the target's, and on ONNX
    the drafter's step graph when it scores the whole vocabulary (sessions do not share
    prepacked weights); one ExecuTorch program packs it once."""
    full_vocab_drafter = p.drafter is not None and not p.drafter.draft_vocab
    return 1 + (full_vocab_drafter and p.runtime.backend == "onnx")


def lm_head(p: Plan) -> Term:
    t, r = p.target, p.recipe
    own = not t.tied or r.tied_head_stored or (  # torch.onnx folds a small tied table's
        p.runtime.backend == "onnx" and target_form(p) == "past_present"  # transpose
        and t.vocab * t.hidden <= FOLD_LIMIT)
    matrix = r.lm_head.bytes(t.vocab, t.hidden) if own else t.vocab * t.hidden * r.linear.bits // 8
    stored = matrix if own else 0
    copies = head_copies(p)
    if own and copies > 1 and matrix < SHARE_MIN:
        stored += matrix  # too small to share: the drafter graph holds its own
    f = p.runtime.factor(r.name)
    what = (f"its own matrix, {r.lm_head.describe()}" if own else
            "the tied embedding table (no extra bytes stored; each graph computes with a "
            "transposed copy)")
    return Term("target.lm_head", "LM head", stored, round(copies * matrix * f),
                f"V x H = {t.vocab} x {t.hidden}: {what} = {mib(matrix)}; resident {copies} "
                f"cop{'y' if copies == 1 else 'ies'} x {f:.2f}"
                + (" (target and drafter graphs)" if copies > 1 else ""))


def kv_cache(p: Plan) -> Term:
    t, r = p.target, p.recipe
    positions = p.context if p.kv_positions is None else p.kv_positions
    size = t.kv_bytes(positions, r.kv_bytes)
    sliding = (f", {t.sliding_layers} layers capped at {t.sliding_window}" if t.sliding_layers
               else "")
    return Term("target.kv", "target KV cache", 0, size,
                f"2 x {t.layers} layers x {t.kv_heads} kv heads x {t.head_dim} x {r.kv_bytes} B x "
                f"{positions} positions{sliding} = {mib(size)}", grows=True)


# ------------------------------------------------------------------ drafter


def drafter_weights(p: Plan) -> Term:
    d, r = p.drafter, p.draft_recipe
    own = sum(r.linear.bytes(m.rows, m.cols, m.count) for m in d.linears()) \
        + d.small_params * F32
    stored, graphs, note = own, own, ""
    if p.runtime.backend == "onnx":  # the commit-only graph computes with fc and every k/v
        commit = {m.name: r.linear.bytes(m.rows, m.cols, m.count) for m in d.linears()
                  if m.name in ("fc", "k_proj", "v_proj")}
        graphs += sum(commit.values())  # its session prepacks its own copy
        # stored again: float k/v too big for the step graph's folder (it keeps [out, in],
        # the commit graph a transposed copy) and anything too small to share
        again = {m.name for m in d.linears() if m.name in commit and (
            (r.linear.group == 0 and m.name != "fc" and m.rows * m.cols > FOLD_LIMIT)
            or r.linear.bytes(m.rows, m.cols) < SHARE_MIN)}
        if again:
            stored += sum(commit[n] for n in again)
            note = f"; the commit graph stores its own {'/'.join(sorted(again))}"
        note += "; resident with the commit graph's own copy of fc + k/v"
    f = p.runtime.factor(r.name)
    return Term("drafter.weights", "drafter weights", stored, round(graphs * f),
                f"{d.params} parameters ({d.layers} layers, hidden {d.hidden}, fc {d.feature_size}"
                f"->{d.hidden}) as {r.linear.describe()} = {mib(own)}{note}; resident x {f:.2f}")


def drafter_head(p: Plan) -> Term:
    d, r = p.drafter, p.draft_recipe
    if not d.draft_vocab:
        return Term("drafter.head", "drafter LM head", 0, 0,
                    "the target's LM head (full vocabulary): counted under LM head")
    size = r.lm_head.bytes(d.draft_vocab, d.hidden)
    f = p.runtime.factor(r.name)
    scatter = 0
    if p.runtime.backend == "onnx":  # constants of the scatter back to the whole vocabulary
        scatter = (d.block - 1) * (d.vocab * F32 + d.draft_vocab * 8)
    return Term("drafter.head", "drafter LM head", size + scatter, round((size + scatter) * f),
                f"draft vocabulary {d.draft_vocab} x {d.hidden} as {r.lm_head.describe()} = "
                f"{mib(size)}" + (f" + scatter constants (B-1) x (V x 4 + Vd x 8) = "
                                  f"{mib(scatter)}" if scatter else "") + f"; resident x {f:.2f}")


def drafter_state(p: Plan) -> Term:
    d = p.drafter
    state = d.state_bytes(p.context)
    rows = p.commit_rows or d.block
    buffer = rows * d.feature_size * F32
    what = ("window + memory, fixed whatever the context" if d.arch == "hyflash" else
            "its window is the whole context: grows with it")
    cache = "per-layer K and V" if d.window_cache == "kv" else "fused features"
    window = d.window if d.arch == "hyflash" else p.context
    return Term("drafter.state", "drafter state", 0, 2 * state + buffer,
                f"{what}: {d.arch} state {mib(state)} ({cache} of {window} rows x {d.hidden}, "
                f"memory S+z) x 2 (a call's input and output) + commit buffer {rows} x "
                f"{d.feature_size} x 4 B", grows=d.arch == "full")


# ------------------------------------------------------------- activations


def activations(p: Plan) -> Term:
    """The larger of one prefill call and one verify + draft round (float32)."""
    t = p.target
    block = p.drafter.block if p.drafter else 1

    def call(rows: int, keys: int) -> int:
        out = rows * (t.vocab + t.feature_size) * F32  # logits and features returned
        scratch = rows * (3 * t.intermediate + 4 * t.hidden) * F32  # one layer at a time
        scores = t.heads * rows * keys * F32
        return out + scratch + scores

    prefill = call(p.prefill, p.prefill)
    if p.runtime.backend == "executorch":  # the chunks' logits and their concatenation
        prefill += p.prefill * t.vocab * F32
    verify = call(block, p.context)
    if p.drafter:
        verify += (block - 1) * t.vocab * F32
    size = max(prefill, verify)
    which = "prefill" if prefill >= verify else "verify"
    twice = ("; ExecuTorch holds the prefill's logits twice (chunks and their concatenation)"
             if p.runtime.backend == "executorch" else "")
    return Term("activations", "activations + logits", 0, size,
                f"max(prefill of {p.prefill} rows = {mib(prefill)}, verify of {block} rows + "
                f"drafter logits = {mib(verify)}): rows x (V + F + 3I + 4H) x 4 B + heads x rows "
                f"x keys x 4 B{twice}; the {which} is larger")


# ----------------------------------------------------------------- runtime


def runtime(p: Plan) -> list[Term]:
    """The runtime itself, its further graph sessions, and on the desktop the first run's
    working set: all measured (``runtime_costs``)."""
    rt = p.runtime
    if p.desktop:
        out = [Term("runtime", "runtime (Python process)", 0, rt.desktop_process_bytes,
                    f"measured: a Python process with hyflash's {rt.backend} runtime imported and "
                    f"a trivial graph open = {mib(rt.desktop_process_bytes)}")]
    else:
        out = [Term("runtime", "runtime library", 0, rt.library_bytes,
                    f"measured: {rt.backend} library + a trivial session over bare Python = "
                    f"{mib(rt.library_bytes)} (the app's own process is not counted)")]
    extra = 2 if p.drafter is not None and rt.backend == "onnx" else 0
    if extra and rt.session_bytes:
        out.append(Term("sessions", "drafter graph sessions", 0, extra * rt.session_bytes,
                        f"measured: {extra} more ONNX Runtime sessions (drafter step and commit) "
                        f"x {mib(rt.session_bytes)}"))
    if p.desktop:
        out.append(Term("run", "first-run working set", 0, rt.run_bytes,
                        f"measured on the calibration bundles: what decoding adds beyond the "
                        f"other terms (arenas, the engine's temporaries) = {mib(rt.run_bytes)}"))
    return out


WEIGHT_TERMS = ("target.layers", "target.lm_head", "drafter.weights", "drafter.head")


def first_calls(p: Plan, terms: list[Term]) -> Term | None:
    """Weights a runtime resolves or unpacks on its first calls (measured per recipe)."""
    f = p.runtime.run_weights_factor.get(p.recipe.name, 0.0)
    if f <= 0:
        return None
    stored = sum(t.resident for t in terms if t.key in WEIGHT_TERMS) / p.runtime.factor(
        p.recipe.name)
    return Term("weights.run", "weights unpacked by the first calls", 0, round(stored * f),
                f"{f:.2f} x the weights as loaded ({mib(stored)}), measured for "
                f"{p.runtime.backend} {p.recipe.name}")


def load_transient(p: Plan, terms: list[Term]) -> Term:
    """Loading the target graph (the largest) needs buffers that exist only meanwhile."""
    weights = sum(t.resident for t in terms if t.key in ("target.layers", "target.lm_head"))
    f = p.runtime.load_transient_factor
    return Term("load", "load transient", 0, round(weights * f),
                f"{f:.2f} x the target graph's resident weights ({mib(weights)}); "
                f"{p.runtime.source}")


def budget(p: Plan) -> Budget:
    terms = [target_layers(p), embedding(p), lm_head(p), kv_cache(p)]
    if p.drafter is not None:
        terms += [drafter_weights(p), drafter_head(p), drafter_state(p)]
    terms += [activations(p), *runtime(p)]
    terms += [t for t in (first_calls(p, terms), load_transient(p, terms)) if t is not None]
    return Budget(p, terms)

"""Training overhead of ``tb_introspect.torch.Introspector``, on CPU: wall and CPU time.

For each model, identical copies train side by side in one process: a plain PyTorch loop,
the same loop with ``Introspector`` at ``every="epoch"`` and ``every=16`` (default
settings, all four views), and the same loop with ``wandb.watch(model, log="all",
log_freq=N)`` (offline: ``WANDB_MODE=offline``, nothing leaves the machine) at the same
cadences. After a warm-up epoch each, rounds of one epoch per variant are interleaved (the
order rotates every round and runs backwards every second one, so no variant always follows
the same one) and each figure is the median over rounds of the per-round ratio to the plain
loop. An instrumented epoch ends with ``flush()``: the work its point left to the
worker thread is counted in its epoch, not in the next variant's. ``--control`` adds a
second plain copy, whose ratio to the first is what two identical copies differ by here.
"added CPU ms/step" is the CPU time above the plain loop divided
by the epoch's steps, logging included. Every variant hands its loss over once per step
(``intro.step(loss=loss)``, ``wandb.log({"loss": loss.item()})``); the plain loop does not.

``--compile`` adds the plain loop and the two ``Introspector`` variants under
``torch.compile`` (compiled after the ``Introspector`` is made, as a user would; a
warm-up of at least two windows of every phase compiles every graph), each against the
compiled plain loop.

Models: the reference CNN (3 x conv-BN-ReLU-pool with 32/64/128 channels, Flatten, Dense
128 + ReLU, dropout 0.2, Dense 10) and a MobileNetV2 written here (torchvision's layout:
inverted residual blocks, ReLU6, width 1.0), both on 32x32x3 inputs, batch 64; and a
GPT-style language model (4 pre-LN causal ``nn.TransformerEncoderLayer`` blocks, width 128,
4 heads, GELU MLP 512, vocabulary 1000, sequence 64, batch 32, next-token loss); the same
with nanoGPT's blocks (``sdpa``: attention through ``F.scaled_dot_product_attention``); a
small Hugging Face Llama of the same sizes (``llama``).

    python benchmarks/torch_overhead.py --threads 1           # the table of docs/benchmarks.md
    python benchmarks/torch_overhead.py --models gpt,sdpa,llama --threads 1 --control
    python benchmarks/torch_overhead.py --on-finding --no-wandb  # on_finding's cost
    python benchmarks/torch_overhead.py --models cnn --quick  # a fast smoke run
    python benchmarks/torch_overhead.py --profile --models cnn,gpt  # where a step's time goes
    python benchmarks/torch_overhead.py --models gpt --probes --no-wandb  # the probes' cost
    python benchmarks/torch_overhead.py --models sdpa --compile --no-wandb  # under compile

``--profile`` times, on one model copy, a plain step (a second copy, no hooks), a lean step
(the rectifier outputs' activity counts and the gradient sum), a statistics step and a
logged point (one statistics step's window: its CPU on the training thread, and on its
worker thread, which a trainer's cadence charges too), interleaved, medians (with
``--probes``: a statistics step without the probes, and a paced run's probe point: its
light probe step and the point on both threads); then it lists
the operators ``torch.profiler`` sees in a few lean and statistics steps (self CPU time,
their total against the steps' time: the rest is Python) and the point's costliest
functions (cProfile).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tb_introspect.pipeline.governor import Phase  # noqa: E402
from tb_introspect.torch import Introspector  # noqa: E402
from tb_introspect.torch.probe_points import Held  # noqa: E402

_WATCHED = itertools.count()
COMPILED = "compiled: "
TARGETS = {"Introspector(every='epoch')": (1.05, 1.10), "Introspector(every=16)": (1.10, 1.10)}
#: The transformers' (wall, CPU) targets, probes on: the wall's tighter at ``every=16``.
TRANSFORMER_TARGETS = {**TARGETS, "Introspector(every=16)": (1.05, 1.10)}
#: The second plain copy of ``--control``.
CONTROL = "plain, a second copy"


def reference_cnn() -> nn.Sequential:
    layers: list[nn.Module] = []
    c_in = 3
    for c in (32, 64, 128):
        layers += [nn.Conv2d(c_in, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(),
                   nn.MaxPool2d(2)]
        c_in = c
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(128 * 4 * 4, 128), nn.ReLU(),
                         nn.Dropout(0.2), nn.Linear(128, 10))


class InvertedResidual(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int, expand: int):
        super().__init__()
        hidden = c_in * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers += [nn.Conv2d(c_in, hidden, 1, bias=False), nn.BatchNorm2d(hidden),
                       nn.ReLU6()]
        layers += [nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
                   nn.BatchNorm2d(hidden), nn.ReLU6(),
                   nn.Conv2d(hidden, c_out, 1, bias=False), nn.BatchNorm2d(c_out)]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.residual else self.conv(x)


def mobilenet_v2(classes: int = 10) -> nn.Sequential:
    """torchvision's ``mobilenet_v2(num_classes=10)`` layout (stride-2 stem, 17 blocks)."""
    config = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
              (6, 160, 3, 2), (6, 320, 1, 1)]
    layers: list[nn.Module] = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32),
                               nn.ReLU6()]
    c_in = 32
    for t, c, n, s in config:
        for i in range(n):
            layers.append(InvertedResidual(c_in, c, s if i == 0 else 1, t))
            c_in = c
    layers += [nn.Conv2d(c_in, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.ReLU6(),
               nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(1280, classes)]
    return nn.Sequential(*layers)


class GPT(nn.Module):
    """A small GPT: token and position embeddings, pre-LN causal encoder blocks, a head."""

    def __init__(self, vocab: int = 1000, seq: int = 64, width: int = 128, heads: int = 4,
                 mlp: int = 512, blocks: int = 4):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(width, heads, mlp, activation="gelu", batch_first=True,
                                       norm_first=True) for _ in range(blocks))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq),
                             persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x, src_mask=self.mask[:t, :t], is_causal=True)
        return self.head(self.norm(x))


class CausalSelfAttention(nn.Module):
    """nanoGPT's attention: one q/k/v projection, ``F.scaled_dot_product_attention``."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.reshape(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in self.qkv(x).split(c, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class SdpaBlock(nn.Module):
    def __init__(self, width: int, heads: int, mlp: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.mlp = nn.Sequential(nn.Linear(width, mlp), nn.GELU(), nn.Linear(mlp, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class SdpaGPT(GPT):
    """``GPT``'s sizes with nanoGPT's blocks (attention through the fused kernel)."""

    def __init__(self, width: int = 128, heads: int = 4, mlp: int = 512, blocks: int = 4):
        super().__init__(width=width, heads=heads, mlp=mlp, blocks=blocks)
        self.blocks = nn.ModuleList(SdpaBlock(width, heads, mlp) for _ in range(blocks))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def small_llama() -> nn.Module:
    """A small Hugging Face Llama at its default initialisation (built from a config: RMS
    norm, rotary positions, SwiGLU, grouped-query attention through sdpa), ``GPT``'s sizes."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=1000, hidden_size=128, intermediate_size=344, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation="sdpa")
    return Logits(transformers.LlamaForCausalLM(config))


def images(batch: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.randn(batch, 3, 32, 32, generator=g),
            torch.randint(0, 10, (batch,), generator=g))


def tokens(batch: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.randint(0, 1000, (batch, 65), generator=g)
    return idx[:, :-1], idx[:, 1:]  # next-token targets


def digits_cnn() -> nn.Module:
    """The trainer tests' digits CNN (a LightningModule, trained here by the plain loop)."""
    from tests.trainers import lightning_support as ls

    return ls.digits_cnn()


def digits(batch: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.rand(batch, 1, 8, 8, generator=g),
            torch.randint(0, 10, (batch,), generator=g))


class Logits(nn.Module):
    """A Hugging Face language model's logits (its forward returns an output object)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=idx).logits


def tiny_gpt2() -> nn.Module:
    """The trainer tests' tiny GPT-2 (2 layers, width 64, vocabulary 128)."""
    from tests.trainers import hf_support as hs

    return Logits(hs.gpt2())


def gpt2_tokens(batch: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.randint(0, 128, (batch, 17), generator=g)
    return idx[:, :-1], idx[:, 1:]


#: name: (model, one batch of data, default batch size, table name)
MODELS: dict[str, tuple[Callable[[], nn.Module], Callable, int, str]] = {
    "cnn": (reference_cnn, images, 64, "reference CNN"),
    "gpt": (GPT, tokens, 32, "GPT-style"),
    "sdpa": (SdpaGPT, tokens, 32, "GPT-style, sdpa attention"),
    "llama": (small_llama, tokens, 32, "small Llama (Hugging Face's)"),
    "mobilenetv2": (mobilenet_v2, images, 64, "MobileNetV2"),
    "digits": (digits_cnn, digits, 16, "digits CNN (Lightning's)"),
    "gpt2": (tiny_gpt2, gpt2_tokens, 8, "tiny GPT-2 (Hugging Face's)"),
}
TRANSFORMERS = ("gpt", "sdpa", "llama")
#: A later point's cost on the training thread, its statistics step's extra time
#: included (ms): the trainer benchmarks' two models.
POINT_TARGET_MS = {"digits": 10.0, "gpt2": 15.0}


class Variant:
    """One copy of the model with its optimizer and its instrumentation."""

    def __init__(self, name: str, build: Callable[[], nn.Module], kind: str, every: object,
                 log_root: str, wandb_run: object = None, compiled: str | None = None,
                 **options: object):
        torch.manual_seed(0)
        self.name, self.kind, self.compiled = name, kind, compiled
        self.model = build()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.intro = None
        self.wandb = None
        if kind == "introspector":
            self.intro = Introspector(os.path.join(log_root, name.replace("'", "")),
                                      self.model, self.opt, every=every, **options)
        elif kind == "wandb":
            import wandb

            self.wandb = wandb
            # one graph index per watched model: wandb names its hooks by it
            wandb.watch(self.model, log="all", log_freq=int(every), idx=next(_WATCHED))
        # compiled after the Introspector's hooks, as a user would (``compiled``: the backend)
        self.run = (torch.compile(self.model, backend=compiled) if compiled is not None
                    else self.model)
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def epoch(self, data: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        self.model.train()
        for x, y in data:
            loss = train_step(self.run, self.opt, x, y)
            if self.intro is not None:
                self.intro.step(loss=loss)
            elif self.wandb is not None:
                self.wandb.log({"loss": loss.item()})
        if self.intro is not None:
            self.intro.end_epoch()
            self.intro.flush()  # its point's work on the worker: this epoch's, not the next's
        return time.perf_counter() - wall, time.process_time() - cpu

    def close(self) -> None:
        if self.intro is not None:
            self.intro.close()


def run_model(kind: str, args: argparse.Namespace, root: str) -> list[dict]:
    build, batch_of, default_batch, _ = MODELS[kind]
    batch = args.batch or default_batch
    g = torch.Generator().manual_seed(0)
    data = [batch_of(batch, g) for _ in range(args.steps)]
    wandb_run = None
    specs = [("plain", "plain", None),
             ("Introspector(every='epoch')", "introspector", "epoch"),
             ("Introspector(every=16)", "introspector", 16)]
    if args.control:
        specs.append((CONTROL, "control", None))
    if args.wandb:
        os.environ["WANDB_MODE"] = "offline"
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        wandb_run = wandb.init(project="tb-introspect-bench", dir=root, mode="offline")
        specs += [(f"wandb.watch(log_freq={args.steps})", "wandb", args.steps),
                  ("wandb.watch(log_freq=16)", "wandb", 16)]
    if args.on_finding:  # every rule judged after each point, a callable that does nothing
        specs += [("Introspector(every='epoch', on_finding)", "introspector", "epoch"),
                  ("Introspector(every=16, on_finding)", "introspector", 16)]
    if args.probes:  # the transformer probes off: the default's difference is their cost
        specs += [("Introspector(every='epoch', probes=False)", "introspector", "epoch"),
                  ("Introspector(every=16, probes=False)", "introspector", 16)]
    if args.compile:  # the same three under torch.compile, against the compiled plain loop
        specs += [(f"{COMPILED}{n}", k, e) for n, k, e in specs[:3]]
    variants = [Variant(n, build, k, e, root, wandb_run,
                        compiled=args.compile if n.startswith(COMPILED) else None,
                        **({"on_finding": lambda f: None, "on_finding_severity": "info"}
                           if "on_finding" in n else
                           {"probes": False} if "probes=False" in n else {}))
                for n, k, e in specs]
    for v in variants:  # warm-up: first-call allocations, hook set-up
        v.epoch(data[: max(2, args.steps // 8)])
        if v.compiled:  # every graph compiled: two windows of every phase
            for _ in range(max(2, -(-32 // len(data)))):
                v.epoch(data)
    for r in range(args.rounds):
        order = variants[r % len(variants):] + variants[: r % len(variants)]
        for v in order[::-1] if r % 2 else order:
            w, c = v.epoch(data)
            v.wall.append(w)
            v.cpu.append(c)
        print(f"  {kind} round {r + 1}/{args.rounds}: "
              + ", ".join(f"{v.name} {v.wall[-1]:.1f}s" for v in variants), file=sys.stderr)
    for v in variants:
        v.close()
        w = v.intro.pipeline.findings if v.intro is not None else None
        if w is not None and w.seconds:
            print(f"  {kind} {v.name}: {len(w.seconds)} judgements on the worker thread,"
                  f" median {statistics.median(w.seconds) * 1000:.0f} ms, max"
                  f" {max(w.seconds) * 1000:.0f} ms", file=sys.stderr)
    if wandb_run is not None:
        wandb_run.finish()
    rows = []
    for v in variants:
        base = next(b for b in variants if b.kind == "plain" and b.compiled == v.compiled)
        if v is base:
            continue
        rows.append({
            "model": kind, "variant": v.name,
            "wall": statistics.median(a / b for a, b in zip(v.wall, base.wall, strict=True)),
            "cpu": statistics.median(a / b for a, b in zip(v.cpu, base.cpu, strict=True)),
            "ms": statistics.median((a - b) * 1000 / args.steps
                                    for a, b in zip(v.cpu, base.cpu, strict=True)),
            "plain_ms": statistics.median(base.wall) * 1000 / args.steps, "batch": batch,
            "plain": f"{kind}{' compiled' if v.compiled else ''}",
        })
    return rows


def train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                y: torch.Tensor) -> torch.Tensor:
    out = model(x)
    loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def profile_model(kind: str, args: argparse.Namespace, root: str) -> None:
    """Per-step costs of the lean step, the statistics step and a logged point."""
    import cProfile
    import pstats

    from torch.profiler import ProfilerActivity, profile

    build, batch_of, default_batch, name = MODELS[kind]
    x, y = batch_of(args.batch or default_batch, torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    plain = build()
    torch.manual_seed(0)
    model = build()
    opt_plain = torch.optim.SGD(plain.parameters(), lr=0.01, momentum=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    intro = Introspector(os.path.join(root, f"profile-{kind}"), model, opt, every="epoch",
                         overhead=None)

    def step(phase: str) -> None:
        if phase == "plain":
            train_step(plain, opt_plain, x, y)
            return
        # The phase the governor would have chosen, its hooks in place before the forward.
        probes, was_on = intro.probes, intro.probes.on
        probes.on = was_on and phase != "no probes"  # a statistics step without the probes
        probes.follow(Phase.LEAN)  # (their cost is the difference): hooks off, then as
        intro.hooks.set_phase(Phase.LEAN if phase in ("activity", "light") else
                              Phase.STATS, phase == "light")  # "light": a probe step
        probes.follow(intro.hooks.phase, intro.hooks.probing)  # the phase asks
        intro.step(loss=train_step(model, opt, x, y))
        probes.on = was_on

    worker = intro.pipeline.worker

    def point() -> float:
        """The point's training-thread CPU seconds; its worker's work done before return."""
        t = time.thread_time()
        intro.pipeline.log(intro.step_count)
        spent = time.thread_time() - t
        worker.wait()
        return spent

    def probe_point() -> float:
        """A probe point's training-thread CPU seconds (``ProbePoints.hold`` and
        ``release``); its worker's work done before return."""
        t = time.thread_time()
        points = intro.probe_points
        points.held = Held(intro.step_count, 1, 0.0, intro.probes.take(True), 0.0)
        points.release()
        spent = time.thread_time() - t
        worker.wait()
        return spent

    phases = ("plain", "activity", "stats") + (("no probes", "light") if args.probes else ())
    for ph in phases * 2:  # warm-up
        step(ph)
    point()
    times: dict[str, list[float]] = {ph: [] for ph in (*phases, "point", "worker",
                                                       "probe point", "probe worker")}
    for _ in range(args.rounds):
        for ph in phases:
            t = time.process_time()
            step(ph)
            times[ph].append(time.process_time() - t)
            if ph == "light":  # the probe point of the light step just run
                t = time.process_time()
                times["probe point"].append(probe_point())
                times["probe worker"].append(time.process_time() - t
                                             - times["probe point"][-1])
        t = time.process_time()
        times["point"].append(point())  # the window of the statistics step just run
        times["worker"].append(time.process_time() - t - times["point"][-1])
    ms = {ph: statistics.median(v) * 1000 for ph, v in times.items() if v}
    cost = ms["stats"] - ms["plain"] + ms["point"]
    target = POINT_TARGET_MS.get(kind)
    print(f"\n{name}: CPU ms per step, median of {args.rounds} interleaved: plain"
          f" {ms['plain']:.1f}, lean {ms['activity']:.1f} (+{ms['activity'] - ms['plain']:.1f}),"
          f" statistics {ms['stats']:.1f} (+{ms['stats'] - ms['plain']:.1f}), logged point"
          f" {ms['point']:.1f} on the training thread, {ms['worker']:.1f} on its worker"
          f" ({len(intro.outputs)} outputs, {len(intro.params)} parameters)")
    if args.probes:
        print(f"  the probes ({len(intro.probes.rows)} rows): +{ms['stats'] - ms['no probes']:.1f}"
              f" ms of the statistics step's {ms['stats']:.1f}")
        light = ms["light"] - ms["activity"] + ms["probe point"] + ms["probe worker"]
        print(f"  a probe point (docs/options.md): its light step"
              f" +{ms['light'] - ms['activity']:.2f} ms over a lean one, the point"
              f" {ms['probe point']:.2f} ms on the training thread and"
              f" {ms['probe worker']:.2f} ms on its worker: {light:.2f} ms, one per planned"
              f" window ({light / ms['plain'] * 100:.0f} % of a plain step)")
    print(f"  a later point on the training thread, its statistics step included:"
          f" {cost:.1f} ms" + (f" (target <= {target:.0f} ms)" if target else ""))
    print(f"  a later point's whole CPU, training thread and worker:"
          f" {cost + ms['worker']:.1f} ms ({cost:.1f} + {ms['worker']:.1f})")
    for ph, label in (("activity", "lean"), ("stats", "statistics")):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t = time.perf_counter()  # the profiler's clock
            for _ in range(3):
                step(ph)
            seconds = time.perf_counter() - t
        events = prof.key_averages()
        ops = sum(e.self_cpu_time_total for e in events) / 1e6
        top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:10]
        print(f"  {label} step (3 steps, {seconds * 1000 / 3:.1f} ms each under the profiler,"
              f" operators {ops * 1000 / 3:.1f} ms): " + ", ".join(
                  f"{e.key} {e.self_cpu_time_total / 3000:.2f} ms ({e.count // 3})"
                  for e in top))
    step("stats")
    worker.threaded = False  # the worker's jobs inline, where cProfile sees them
    pr = cProfile.Profile()
    pr.enable()
    point()
    pr.disable()
    worker.threaded = True
    st = pstats.Stats(pr)
    rows = sorted(((v[3], f"{k[2]}") for k, v in st.stats.items()  # type: ignore[attr-defined]
                   if "tb_introspect" in k[0] or k[0] == "~"), reverse=True)
    print("  logged point (its worker's jobs inline), cumulative: "
          + ", ".join(f"{fn} {t * 1000:.1f} ms" for t, fn in rows[:12]))
    intro.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="cnn,gpt,mobilenetv2", help=", ".join(MODELS))
    p.add_argument("--steps", type=int, default=96, help="steps per epoch")
    p.add_argument("--batch", type=int, default=0, help="0: the model's (64, GPT 32)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median over them)")
    p.add_argument("--wandb", action=argparse.BooleanOptionalAction, default=True,
                   help="add the wandb.watch peer (offline)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--quick", action="store_true", help="smoke run: 8 steps, 1 round")
    p.add_argument("--on-finding", action="store_true",
                   help="add the Introspector variants with on_finding (a no-op callable)")
    p.add_argument("--probes", action="store_true",
                   help="add the Introspector variants with probes=False (the probes' cost)")
    p.add_argument("--compile", nargs="?", const="inductor", default=None, metavar="BACKEND",
                   help="add the plain loop and the Introspector under torch.compile"
                        " (default backend: inductor), against the compiled plain loop")
    p.add_argument("--profile", action="store_true",
                   help="per-step costs and operator profiles instead of the overhead table")
    p.add_argument("--control", action="store_true",
                   help="add a second plain copy: what two identical copies differ by")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.rounds = 8, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.profile:
        with tempfile.TemporaryDirectory() as root:
            for kind in args.models.split(","):
                profile_model(kind.strip(), args, root)
        print(f"\nload average {os.getloadavg()[0]:.1f}")
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for kind in args.models.split(","):
            rows += run_model(kind.strip(), args, root)
    load = os.getloadavg()
    print(f"\n{args.steps} steps per epoch, median of {args.rounds}"
          f" interleaved rounds, torch {torch.__version__}, {torch.get_num_threads()} threads,"
          f" load average {load[0]:.1f}\n")
    print("| model | configuration | wall | CPU | added CPU ms/step | target |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        targets = TRANSFORMER_TARGETS if r["model"] in TRANSFORMERS else TARGETS
        wall_t, cpu_t = targets.get(r["variant"], (None, None))
        target = " / ".join(f"≤ {t:.2f}×" for t in (wall_t, cpu_t) if t) or ""
        name = MODELS[r["model"]][3]
        print(f"| {name} | `{r['variant']}` | {r['wall']:.2f}× | {r['cpu']:.2f}× |"
              f" {r['ms']:.0f} | {target} |")
    print("\nplain loop: " + ", ".join(sorted({f"{r['plain']} {r['plain_ms']:.0f} ms/step"
                                               f" (batch {r['batch']})"
                                               for r in rows})))
    return 0


if __name__ == "__main__":
    sys.exit(main())

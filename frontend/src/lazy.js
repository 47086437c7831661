// Draws grid panels near the viewport first and the others in idle time.
//
// A 200-panel grid is 200 uPlot instances and canvases: creating and
// rasterising them all up front costs the browser about a second of CPU
// before the first screen is complete (benchmarks/frontend_bench.py). Here
// the panels within about a screen of the viewport are drawn as soon as
// their data is in; the rest are drawn in idle callbacks (a few per
// callback, so scrolling and hovering stay responsive) or as soon as they
// scroll near. Every panel ends up drawn either way.
//
// Near panels are drawn in slices of SLICE_MS, yielding to the browser in
// between: drawn all in one task, the ~40 near panels of a 158-tensor
// MobileNetV2 view blocked the main thread for over 200 ms.

const SLICE_MS = 30;

export class LazyDrawer {
  /**
   * @param draw(p) draws panel `p` (its data is on p.series); must set p.chart.
   * @param onComplete() called once every watched panel is drawn.
   */
  constructor(draw, onComplete) {
    this.draw = draw;
    this.onComplete = onComplete;
    this.panels = [];
    this.pending = new Set();
    this.idle = 0;
    this.stopped = false;
    this.urgent = new Set();
    this.pumping = null;
    let seen;
    this.firstCallback = new Promise((resolve) => (seen = resolve));
    this.io = new IntersectionObserver((entries) => {
      for (const e of entries) {
        const p = e.target.__panel;
        if (!p) continue;
        p.near = e.isIntersecting;
        if (p.near) this.drawSoon(p);
      }
      seen();
    }, { rootMargin: "100% 0px" });
  }

  watch(p) {
    p.el.__panel = p;
    this.panels.push(p);
    this.io.observe(p.el);
  }

  /** The panel's data arrived. */
  ready(p) {
    if (this.stopped) return;
    if (p.near) this.drawSoon(p);
    else {
      this.pending.add(p);
      this.kick();
    }
  }

  drawNow(p) {
    this.urgent.delete(p);
    if (this.stopped || !p.series) return;
    // Drawn already (near, or redrawn by a reload): out of the idle queue, which would
    // otherwise spin on it.
    this.pending.delete(p);
    if (p.chart) return;
    this.draw(p);
    this.check();
  }

  /** Queues a near panel; the queue is drawn in time slices (see SLICE_MS). */
  drawSoon(p) {
    if (this.stopped || p.chart || !p.series) return;
    this.urgent.add(p);
    this.schedule();
  }

  schedule() {
    if (this.pumping || this.stopped) return;
    // Cleared only once the pump has settled (a pump that drew everything
    // synchronously must not leave a settled promise behind as "running").
    this.pumping = this.pump().finally(() => {
      this.pumping = null;
      if (this.urgent.size) this.schedule();
    });
  }

  async pump() {
    while (this.urgent.size && !this.stopped) {
      const end = performance.now() + SLICE_MS;
      do {
        this.drawNow(this.urgent.values().next().value);
      } while (this.urgent.size && performance.now() < end);
      // A macrotask boundary: input and paint get their turn.
      if (this.urgent.size) await new Promise((resolve) => setTimeout(resolve, 0));
    }
  }

  /** Draws every panel that is near the viewport and has its data. */
  async drawNear() {
    await this.firstCallback;
    for (const p of [...this.pending]) if (p.near) this.drawSoon(p);
    while (this.pumping) await this.pumping;
  }

  kick() {
    if (this.idle || this.stopped) return;
    const run = (deadline) => {
      this.idle = 0;
      // At least one panel per callback; more while the browser has time.
      do {
        const p = this.pending.values().next().value;
        if (!p) break;
        this.drawNow(p);
      } while (deadline.timeRemaining() > 4);
      if (this.pending.size) this.kick();
    };
    this.idle = typeof requestIdleCallback === "function"
      ? requestIdleCallback(run, { timeout: 100 })
      : setTimeout(() => run({ timeRemaining: () => 8 }), 16);
  }

  check() {
    if (this.onComplete && this.panels.every((p) => p.chart)) {
      const done = this.onComplete;
      this.onComplete = null;
      done();
    }
  }

  stop() {
    this.stopped = true;
    this.io.disconnect();
    this.pending.clear();
    this.urgent.clear();
    if (this.idle) {
      if (typeof cancelIdleCallback === "function") cancelIdleCallback(this.idle);
      clearTimeout(this.idle);
    }
  }
}

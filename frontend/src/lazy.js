// Draws grid panels near the viewport first and the others in idle time.
//
// A 200-panel grid is 200 uPlot instances and canvases: creating and
// rasterising them all up front costs the browser about a second of CPU
// before the first screen is complete (benchmarks/frontend_bench.py). Here
// the panels within about a screen of the viewport are drawn as soon as
// their data is in; the rest are drawn in idle callbacks (a few per
// callback, so scrolling and hovering stay responsive) or as soon as they
// scroll near. Every panel ends up drawn either way.

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
    let seen;
    this.firstCallback = new Promise((resolve) => (seen = resolve));
    this.io = new IntersectionObserver((entries) => {
      for (const e of entries) {
        const p = e.target.__panel;
        if (!p) continue;
        p.near = e.isIntersecting;
        if (p.near) this.drawNow(p);
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
    if (p.near) this.drawNow(p);
    else {
      this.pending.add(p);
      this.kick();
    }
  }

  drawNow(p) {
    if (this.stopped || p.chart || !p.series) return;
    this.pending.delete(p);
    this.draw(p);
    this.check();
  }

  /** Draws every panel that is near the viewport and has its data. */
  async drawNear() {
    await this.firstCallback;
    for (const p of [...this.pending]) if (p.near) this.drawNow(p);
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
    if (this.idle) {
      if (typeof cancelIdleCallback === "function") cancelIdleCallback(this.idle);
      clearTimeout(this.idle);
    }
  }
}

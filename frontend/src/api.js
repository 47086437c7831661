// Backend client. Every URL is relative: the iframe page has
// <base href="plugin/introspect/">, so "./runs" resolves under TensorBoard's
// --path_prefix and behind proxies with no extra code (docs/http_api.md).

export class ApiError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

async function getJSON(path, params) {
  const qs = new URLSearchParams();
  for (const [k, v] of params || []) qs.append(k, String(v));
  const url = qs.toString() ? `${path}?${qs}` : path;
  const resp = await fetch(url, { headers: { Accept: "application/json" } });
  if (!resp.ok) {
    let message = `${resp.status} ${resp.statusText}`;
    try {
      const body = await resp.json();
      if (body && body.error) message = body.error;
    } catch {
      /* not JSON: keep the status line */
    }
    throw new ApiError(message, resp.status);
  }
  return resp.json();
}

/**
 * The URL of one tag's download at full resolution (`./export`, docs/http_api.md):
 * `format` "csv" or "json"; the server names the file.
 */
export function exportURL(run, tag, format) {
  return `export?${new URLSearchParams({ run, tag, format })}`;
}

/**
 * Caches responses until the next TensorBoard reload (invalidate()), so tab
 * switches are instant and only a reload re-reads the data.
 */
export class Api {
  constructor() {
    this.cache = new Map();
    this.generation = 0;
  }

  invalidate() {
    this.cache.clear();
    this.generation++;
  }

  cached(key, fn) {
    let p = this.cache.get(key);
    if (!p) {
      p = fn();
      this.cache.set(key, p);
      p.catch(() => this.cache.get(key) === p && this.cache.delete(key));
    }
    return p;
  }

  runs() {
    return this.cached("runs", () => getJSON("./runs"));
  }

  run(run) {
    return this.cached(`run\0${run}`, () => getJSON("./run", [["run", run]]));
  }

  overview(run) {
    return this.cached(`overview\0${run}`, () => getJSON("./overview", [["run", run]]));
  }

  /** The run's findings (./findings): read when ./overview was drawn from view summaries. */
  findings(run) {
    return this.cached(`findings\0${run}`, () => getJSON("./findings", [["run", run]]));
  }

  /** The run's transformer probes per row and field (./probes; no rows when it has none). */
  probes(run) {
    return this.cached(`probes\0${run}`, () => getJSON("./probes", [["run", run]]));
  }

  /** One activity map, every epoch (./activity; can be megabytes: read when shown). */
  activity(run, tag) {
    return this.cached(`activity\0${run}\0${tag}`, () => getJSON("./activity", [["run", run], ["tag", tag]]));
  }

  /**
   * Series of many tags, narrowed to `fields`. Tags are fetched in chunks
   * (parallel requests keep URLs short and let the server work while the
   * browser parses) and cached per tag+fields.
   */
  async series(run, tags, fields, { chunk = 40, downsample = 0 } = {}) {
    const out = {};
    const missing = [];
    const key = (t) => `series\0${run}\0${t}\0${fields.join(",")}\0${downsample}`;
    const pending = [];
    for (const t of tags) {
      const c = this.cache.get(key(t));
      if (c) pending.push(c.then((s) => (out[t] = s)));
      else missing.push(t);
    }
    for (let i = 0; i < missing.length; i += chunk) {
      const part = missing.slice(i, i + chunk);
      const params = [["run", run], ...part.map((t) => ["tag", t]), ...fields.map((f) => ["field", f])];
      if (downsample) params.push(["downsample", downsample]);
      const req = getJSON("./series", params);
      for (const t of part) {
        const p = req.then((r) => r.series[t]);
        this.cache.set(key(t), p);
        p.catch(() => this.cache.delete(key(t)));
        pending.push(p.then((s) => (out[t] = s)));
      }
    }
    await Promise.all(pending);
    return out;
  }
}

// The TensorBoard host <-> plugin iframe channel. TensorBoard listens on the
// parent window for the string "experimental.bootstrap" carrying a
// MessagePort, then both sides exchange JSON messages
// {type, id, payload, error, isReply} (tensorboard/webapp plugin_api_host).

export class HostChannel {
  constructor() {
    this.id = 0;
    this.waits = new Map();
    this.listeners = new Map();
    this.port = null;
    if (window.parent && window.parent !== window) {
      const channel = new MessageChannel();
      this.port = channel.port1;
      this.port.addEventListener("message", (e) => this.onMessage(e));
      this.port.start();
      window.parent.postMessage("experimental.bootstrap", "*", [channel.port2]);
    }
  }

  get connected() {
    return this.port !== null;
  }

  listen(type, fn) {
    this.listeners.set(type, fn);
  }

  async onMessage(event) {
    let msg;
    try {
      msg = JSON.parse(event.data);
    } catch {
      return;
    }
    if (msg.isReply) {
      const wait = this.waits.get(msg.id);
      if (!wait) return;
      this.waits.delete(msg.id);
      if (msg.error) wait.reject(new Error(msg.error));
      else wait.resolve(msg.payload);
      return;
    }
    let payload = null;
    let error = null;
    const fn = this.listeners.get(msg.type);
    if (fn) {
      try {
        payload = (await fn(msg.payload)) ?? null;
      } catch (e) {
        error = String(e);
      }
    }
    this.port.postMessage(JSON.stringify({ type: msg.type, id: msg.id, payload, error, isReply: true }));
  }

  /** Sends a request; resolves with the reply, or with `fallback` after `timeoutMs`. */
  send(type, payload = null, timeoutMs = 1500, fallback = null) {
    if (!this.port) return Promise.resolve(fallback);
    const id = this.id++;
    this.port.postMessage(JSON.stringify({ type, id, payload, error: null, isReply: false }));
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.waits.delete(id);
        resolve(fallback);
      }, timeoutMs);
      this.waits.set(id, {
        resolve: (v) => (clearTimeout(timer), resolve(v)),
        reject: () => (clearTimeout(timer), resolve(fallback)),
      });
    });
  }
}

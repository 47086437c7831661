// Bundles src/ into one ES module + one stylesheet under tb_introspect/static/.
// TensorBoard imports ./index.js inside the plugin iframe; index.js loads
// ./index.css through a relative URL, so --path_prefix and proxies just work.
import * as esbuild from "esbuild";
import { fileURLToPath } from "node:url";
import path from "node:path";

const here = path.dirname(fileURLToPath(import.meta.url));
const outdir = path.join(here, "..", "tb_introspect", "static");

const options = {
  entryPoints: { index: path.join(here, "src", "index.js") },
  bundle: true,
  format: "esm",
  // TensorBoard's supported browsers are evergreen; es2020 keeps the output readable.
  target: "es2020",
  minify: !process.argv.includes("--dev"),
  sourcemap: false,
  legalComments: "eof",
  outdir,
  logLevel: "info",
};

if (process.argv.includes("--watch")) {
  const ctx = await esbuild.context(options);
  await ctx.watch();
} else {
  await esbuild.build(options);
}

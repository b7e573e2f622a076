// Copies the UI's third-party files from node_modules into vendor/, the only place the
// binary embeds them from. `npm ci && npm run vendor` then `git diff --exit-code vendor/`
// proves the committed copies are the registry's.
import { copyFileSync, mkdirSync } from "node:fs";

const files = [
  ["node_modules/uplot/dist/uPlot.iife.min.js", "vendor/uPlot.iife.min.js"],
  ["node_modules/uplot/dist/uPlot.min.css", "vendor/uPlot.min.css"],
  ["node_modules/uplot/LICENSE", "vendor/uPlot.LICENSE"],
];
mkdirSync("vendor", { recursive: true });
for (const [from, to] of files) {
  copyFileSync(from, to);
  console.log(`${from} -> ${to}`);
}

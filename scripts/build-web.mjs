// Builds the dashboard (web/) into dist/web, which the orchestrator serves at /
// (src/orchestrator/routes/dashboard.ts): web/src/main.ts and every module and
// stylesheet it imports bundled by esbuild into one script and one stylesheet
// under assets/ with a content hash in their names, and web/index.html written
// with them in place of the source entry. No inline script or style: the
// page's Content-Security-Policy allows its own files only.
//
// Why esbuild rather than Vite: Vite bundles with Rollup, whose native
// binaries for other platforms are not all in the npm registry this project
// installs from, so a lock file holding Vite fails `npm ci`; esbuild is
// already installed (tsx runs on it) with every platform's binary in the lock.
import { build } from 'esbuild';
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { basename, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const out = join(root, 'dist', 'web');
const ENTRY_TAG = '<script type="module" src="./src/main.ts"></script>';

rmSync(out, { recursive: true, force: true });
mkdirSync(join(out, 'assets'), { recursive: true });
const result = await build({
  entryPoints: [join(root, 'web', 'src', 'main.ts')],
  bundle: true,
  format: 'esm',
  target: 'es2022',
  platform: 'browser',
  minify: true,
  sourcemap: false,
  outdir: join(out, 'assets'),
  entryNames: '[name]-[hash]',
  assetNames: '[name]-[hash]',
  metafile: true,
  logLevel: 'warning',
  legalComments: 'none',
});
const outputs = Object.keys(result.metafile.outputs).map((p) => basename(p));
const script = outputs.find((f) => f.endsWith('.js'));
const style = outputs.find((f) => f.endsWith('.css'));
if (!script) throw new Error('build-web: esbuild wrote no script');
const html = readFileSync(join(root, 'web', 'index.html'), 'utf8');
if (!html.includes(ENTRY_TAG)) throw new Error(`build-web: web/index.html has no ${ENTRY_TAG}`);
const page = html
  .replace(ENTRY_TAG, `<script type="module" src="/assets/${script}"></script>`)
  .replace('  </head>', `${style ? `    <link rel="stylesheet" href="/assets/${style}" />\n` : ''}  </head>`);
writeFileSync(join(out, 'index.html'), page);
console.log(`build-web: dist/web/index.html, assets/${script}${style ? `, assets/${style}` : ''}`);

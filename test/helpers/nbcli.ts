// How tests start nbcli as a child process. From the build (dist/, which
// `npm ci` makes and scripts/run-tests.mjs remakes when src/ is newer) when it
// is up to date: a process then starts in about 1 s instead of about 2 s of
// CPU through tsx, and end-to-end tests start dozens of them. When dist/ is
// older than any file of src/ (a focused run right after an edit, without the
// runner), the TypeScript itself runs through tsx, so a test never runs old
// code.
import { readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';

const root = new URL('../..', import.meta.url).pathname;
const SRC = join(root, 'src');
const DIST_MAIN = join(root, 'dist', 'cli', 'main.js');
const SRC_MAIN = join(root, 'src', 'cli', 'main.ts');

function newestMtimeMs(dir: string): number {
  let newest = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, entry.name);
    newest = Math.max(newest, entry.isDirectory() ? newestMtimeMs(p) : statSync(p).mtimeMs);
  }
  return newest;
}

/** Whether dist/ was built after the last change to src/. */
export function distIsFresh(): boolean {
  let built: number;
  try {
    built = statSync(DIST_MAIN).mtimeMs;
  } catch {
    return false;
  }
  return newestMtimeMs(SRC) <= built;
}

let cached: string[] | null = null;

/** [node, ...args] that run nbcli: the build when it is fresh, else the source through tsx (decided once per test process). */
export function nbcliArgv(): string[] {
  cached ??= distIsFresh() ? [process.execPath, DIST_MAIN] : [process.execPath, '--import', 'tsx', SRC_MAIN];
  return [...cached];
}

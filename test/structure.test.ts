// The house rules of src/, checked on every run: no import cycles, and no
// module imports from a layer above its own (README, "Architecture").
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const SRC = fileURLToPath(new URL('../src', import.meta.url));

/** Each room of src/ and its layer, bottom up. */
const LAYERS: Record<string, number> = {
  engine: 0,
  protocol: 0,
  model: 1,
  data: 1,
  merge: 1,
  chain: 1,
  planner: 2,
  jobs: 2,
  inference: 2,
  http: 3,
  api: 3,
  train: 4,
  miner: 4,
  orchestrator: 4,
  sim: 4,
  cli: 5,
};

function sources(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const p = join(dir, name);
    return statSync(p).isDirectory() ? sources(p) : p.endsWith('.ts') ? [p] : [];
  });
}

/** file → the files of src/ it imports (type-only imports included: they are dependencies too). */
function importGraph(): Map<string, string[]> {
  const graph = new Map<string, string[]>();
  for (const file of sources(SRC)) {
    const targets: string[] = [];
    for (const m of readFileSync(file, 'utf8').matchAll(/(?:import|export)\s[^'"]*?from\s+['"](\.[^'"]+)['"]/g)) {
      targets.push(resolve(dirname(file), m[1]));
    }
    graph.set(file, targets);
  }
  return graph;
}

const room = (file: string): string => relative(SRC, file).split('/')[0];

test('every room of src/ has a layer', () => {
  const rooms = new Set([...importGraph().keys()].map(room).filter((r) => !r.endsWith('.ts')));
  assert.deepEqual([...rooms].filter((r) => !(r in LAYERS)), []);
});

test('no module imports from a higher layer', () => {
  const upward: string[] = [];
  for (const [file, targets] of importGraph()) {
    for (const t of targets) {
      const [a, b] = [room(file), room(t)];
      if (a !== b && LAYERS[b] > LAYERS[a]) upward.push(`${relative(SRC, file)} -> ${relative(SRC, t)}`);
    }
  }
  assert.deepEqual(upward, []);
});

test('no import cycles', () => {
  const graph = importGraph();
  const state = new Map<string, 'visiting' | 'done'>();
  const cycles: string[] = [];
  const visit = (file: string, path: string[]): void => {
    if (state.get(file) === 'done') return;
    if (state.get(file) === 'visiting') {
      cycles.push([...path.slice(path.indexOf(file)), file].map((f) => relative(SRC, f)).join(' -> '));
      return;
    }
    state.set(file, 'visiting');
    for (const t of graph.get(file) ?? []) visit(t, [...path, file]);
    state.set(file, 'done');
  };
  for (const file of graph.keys()) visit(file, []);
  assert.deepEqual(cycles, []);
});

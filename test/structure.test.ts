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

/**
 * The rooms inside src/orchestrator/ and src/cli/: each folder opens with a
 * README.md whose line `May import: a, b.` names the sibling rooms (or `top`,
 * the files beside them; `none`) that its files may import. The top of each
 * folder holds only the assembly: at most `maxTop` files.
 */
const HOUSES = [
  { dir: 'orchestrator', maxTop: 8 },
  { dir: 'cli', maxTop: 10 },
];

/** The rooms each room of `house` declares it may import, from its README. */
function declaredImports(house: string): Map<string, Set<string>> {
  const base = join(SRC, house);
  const declared = new Map<string, Set<string>>();
  for (const name of readdirSync(base)) {
    if (!statSync(join(base, name)).isDirectory()) continue;
    const readme = join(base, name, 'README.md');
    const text = statSync(readme, { throwIfNoEntry: false }) ? readFileSync(readme, 'utf8') : '';
    const line = /^May import: (.*)\.$/m.exec(text);
    assert.ok(line, `src/${house}/${name}/README.md must open the room with a "May import: …." line`);
    const names = line[1] === 'none' ? [] : line[1].split(/,\s*/);
    declared.set(name, new Set(names));
  }
  return declared;
}

for (const { dir, maxTop } of HOUSES) {
  test(`src/${dir}/ keeps at most ${maxTop} files at its top; every room says what it may import`, () => {
    const base = join(SRC, dir);
    const top = readdirSync(base).filter((n) => !statSync(join(base, n)).isDirectory());
    assert.ok(top.length <= maxTop, `src/${dir}/ has ${top.length} files at its top: ${top.join(', ')}`);
    const declared = declaredImports(dir);
    const roomIn = (file: string): string => {
      const parts = relative(base, file).split('/');
      return parts.length === 1 ? 'top' : parts[0];
    };
    const undeclared: string[] = [];
    for (const [file, targets] of importGraph()) {
      if (!file.startsWith(base + '/')) continue;
      const from = roomIn(file);
      if (from === 'top') continue;
      for (const t of targets) {
        if (!t.startsWith(base + '/')) continue;
        const to = roomIn(t);
        if (to !== from && !declared.get(from)?.has(to)) undeclared.push(`${relative(SRC, file)} -> ${relative(SRC, t)}`);
      }
    }
    assert.deepEqual(undeclared, [], 'imports of rooms their README does not name');
  });
}

test('no file of src/ is over 450 lines', () => {
  const big = sources(SRC)
    .map((f) => [relative(SRC, f), readFileSync(f, 'utf8').split('\n').length] as const)
    .filter(([, n]) => n > 450)
    .map(([f, n]) => `${f} ${n}`);
  assert.deepEqual(big, []);
});

// Rewrites the README's command reference (between its two markers) from the
// nbcli program: run `node --import tsx scripts/cli-reference.ts` after adding
// or changing a command or a flag. test/cli/readme.test.ts fails until then.
import { readFileSync, writeFileSync } from 'node:fs';
import { buildProgram } from '../src/cli/program.ts';
import { renderReference } from '../src/cli/reference.ts';
import { README_BEGIN, README_END } from '../test/cli/readme-markers.ts';

const path = new URL('../README.md', import.meta.url);
const readme = readFileSync(path, 'utf8');
const begin = readme.indexOf(README_BEGIN);
const end = readme.indexOf(README_END);
if (begin < 0 || end < begin) throw new Error(`README.md has no ${README_BEGIN} … ${README_END} section`);
const program = await buildProgram(['node', 'nbcli', '--help']);
const next = readme.slice(0, begin + README_BEGIN.length) + '\n' + renderReference(program) + readme.slice(end);
writeFileSync(path, next);
console.log(next === readme ? 'README.md: the command reference was up to date' : 'README.md: command reference rewritten');

// The README and `nbcli --help` stay in step (issue: the newcomer's first
// hour). Its command reference is exactly what the program renders
// (src/cli/reference.ts), so every command and flag of nbcli is in the
// README; and every `./nbcli …` line of the README's examples names a
// command that exists and only flags that command takes.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { buildProgram } from '../../src/cli/program.ts';
import { commandEntries, renderReference, type CommandEntry } from '../../src/cli/reference.ts';
import { README_BEGIN, README_END } from './readme-markers.ts';

const README = readFileSync(new URL('../../README.md', import.meta.url), 'utf8');
const program = await buildProgram(['node', 'nbcli', '--help']);
const entries = commandEntries(program);

/** The README's lines that run nbcli, in its code blocks, outside the generated reference. */
function exampleLines(readme: string): string[] {
  const withoutReference = readme.slice(0, readme.indexOf(README_BEGIN)) + readme.slice(readme.indexOf(README_END));
  const lines: string[] = [];
  let inCode = false;
  let pending = '';
  for (const raw of withoutReference.split('\n')) {
    if (raw.startsWith('```')) {
      inCode = !inCode;
      continue;
    }
    if (!inCode) continue;
    const line = pending + raw.trim();
    if (line.endsWith('\\')) {
      pending = line.slice(0, -1) + ' ';
      continue;
    }
    pending = '';
    if (line.startsWith('./nbcli')) lines.push(line);
  }
  return lines;
}

/** The commands a README line can mean: each of its `a|b` words tried as a command's words. */
export function commandsOf(line: string, all: readonly CommandEntry[]): CommandEntry[] {
  const words = line.split('#')[0].trim().split(/\s+/).slice(1).filter((w) => !w.startsWith('-') && !w.startsWith('['));
  const pieces = new Set(words.flatMap((w) => w.split('|')));
  return all.filter((e) => e.path.every((w, i) => (i === 0 ? words[0]?.split('|').includes(w) : pieces.has(w))));
}

/** The flags a README line names (its comment included: it names flags of the same command). */
export const flagsOf = (line: string): string[] => [...new Set((line.match(/(?<![\w-])--[a-z][a-z0-9.-]*/g) ?? []).map((f) => f.replace(/[.]$/, '')))];

test("the README's command reference is what the program renders: every command and flag of nbcli --help", () => {
  const begin = README.indexOf(README_BEGIN);
  const end = README.indexOf(README_END);
  assert.ok(begin >= 0 && end > begin, `README.md needs its ${README_BEGIN} … ${README_END} section`);
  const inReadme = README.slice(begin + README_BEGIN.length + 1, end);
  assert.equal(inReadme, renderReference(program), 'the README is behind nbcli --help: run `node --import tsx scripts/cli-reference.ts`');
  for (const e of entries) assert.ok(inReadme.includes(`./nbcli ${e.path.join(' ')}`), e.path.join(' '));
});

test("every ./nbcli example of the README names a command of nbcli and only flags it takes", () => {
  const lines = exampleLines(README);
  assert.ok(lines.length >= 20, `only ${lines.length} example lines found`);
  const problems: string[] = [];
  for (const line of lines) {
    const words = line.split('#')[0].trim().split(/\s+/);
    if (words.length === 2 && ['--help', '--version', '-h', '-V'].includes(words[1])) continue;
    const commands = commandsOf(line, entries);
    if (commands.length === 0) {
      problems.push(`no such command: ${line}`);
      continue;
    }
    // the command part takes only its own flags; a comment may name those of the same family's commands
    const known = new Set(['--help', ...commands.flatMap((c) => c.options.map((o) => o.flag))]);
    const family = new Set([...known, ...entries.filter((e) => e.path[0] === commands[0].path[0]).flatMap((c) => c.options.map((o) => o.flag))]);
    const [command, comment = ''] = [line.split('#')[0], line.split('#').slice(1).join('#')];
    for (const flag of flagsOf(command)) if (!known.has(flag)) problems.push(`${flag} is no flag of ${commands.map((c) => c.path.join(' ')).join(' / ')}: ${line}`);
    for (const flag of flagsOf(comment)) if (!family.has(flag)) problems.push(`${flag} (in the comment) is no flag of any \`${commands[0].path[0]}\` command: ${line}`);
  }
  assert.deepEqual(problems, []);
});

test('the check finds a misspelt command and a flag a command does not take', () => {
  assert.deepEqual(commandsOf('./nbcli walet list', entries), []);
  const [deploy] = commandsOf('./nbcli model deploy NAME --wait', entries);
  assert.deepEqual(deploy.path, ['model', 'deploy']);
  assert.ok(!deploy.options.some((o) => o.flag === '--follow'));
  assert.deepEqual(commandsOf('./nbcli run status|cancel|checkpoint RUN_ID', entries).map((c) => c.path.join(' ')), ['run status', 'run cancel', 'run checkpoint']);
  assert.deepEqual(flagsOf('./nbcli up --job f.json   # or: npm start -- --job f.json; --no-chain.'), ['--job', '--no-chain']);
});

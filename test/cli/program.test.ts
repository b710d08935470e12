// The nbcli program (src/cli/program.ts): which command modules a command line
// loads, and that each module registers the command its entry names (else
// `nbcli NAME` would find no command once only that module is loaded).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { buildProgram, COMMAND_NAMES } from '../../src/cli/program.ts';

const argv = (...args: string[]): string[] => ['node', 'nbcli', ...args];
const names = async (...args: string[]): Promise<string[]> => (await buildProgram(argv(...args))).commands.map((c) => c.name());

test('the top-level help, help X and an unknown command load every command, in the order of the table', async () => {
  assert.ok(COMMAND_NAMES.length >= 16);
  assert.deepEqual(await names('--help'), COMMAND_NAMES);
  assert.deepEqual(await names(), COMMAND_NAMES);
  assert.deepEqual(await names('help', 'wallet'), COMMAND_NAMES);
  assert.deepEqual(await names('walet', 'list'), COMMAND_NAMES);
});

test("a command line naming a command loads that command's module only, and it registers that name", async () => {
  for (const name of COMMAND_NAMES) assert.deepEqual(await names(name, '--help'), [name], name);
  assert.deepEqual(await names('-h', 'miner', 'start', '--name', 'x'), ['miner'], 'options before the command are skipped');
});

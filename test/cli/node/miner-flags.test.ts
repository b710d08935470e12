// nbcli miner start --orchestrator (src/cli/node/miner.ts): one URL, several
// separated by commas, or the flag repeated; each must be an http(s) URL and
// none may be given twice, or the command stops with one line naming it.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Command } from 'commander';
import { parseOrchestratorUrls, registerMiner } from '../../../src/cli/node/miner.ts';
import { NimbleError } from '../../../src/protocol/errors.ts';

/** Runs `nbcli miner start ...args` in this process; resolves with the error it stops with. */
async function minerStartError(args: string[]): Promise<unknown> {
  const program = new Command('nbcli').exitOverride();
  registerMiner(program);
  program.commands.forEach((c) => c.exitOverride().commands.forEach((s) => s.exitOverride()));
  try {
    await program.parseAsync(['miner', 'start', ...args], { from: 'user' });
  } catch (err) {
    return err;
  }
  assert.fail('the command did not stop');
}

test('--orchestrator takes one URL or several, by commas or repeated, without trailing slashes', () => {
  assert.deepEqual(parseOrchestratorUrls(['http://127.0.0.1:7070/']), ['http://127.0.0.1:7070']);
  assert.deepEqual(parseOrchestratorUrls(['http://a:7070, https://b:7070', 'http://c:7070/api']), ['http://a:7070', 'https://b:7070', 'http://c:7070/api']);
});

test('a bad URL in the list, or one given twice, stops the command with one line naming it', async () => {
  const cases: [string[], RegExp][] = [
    [['--orchestrator', 'http://a:7070,not a url'], /^--orchestrator: 'not a url' is not an http\(s\) URL/],
    [['--orchestrator', 'http://a:7070,ftp://b:21'], /^--orchestrator: 'ftp:\/\/b:21' is not an http\(s\) URL/],
    [['--orchestrator', 'http://a:7070,'], /^--orchestrator: '' is not an http\(s\) URL/],
    [['--orchestrator', 'http://a:7070,http://A:7070/'], /^--orchestrator names http:\/\/a:7070 twice$/],
    [['--orchestrator', 'http://a:7070,http://b:7070', '--orchestrator', 'http://b:7070'], /^--orchestrator names http:\/\/b:7070 twice$/],
  ];
  for (const [args, message] of cases) {
    const err = await minerStartError(args);
    assert.ok(err instanceof NimbleError && err.code === 'invalid', `${args.join(' ')}: ${String(err)}`);
    assert.match(err.message, message);
    assert.doesNotMatch(err.message, /\n/);
  }
});

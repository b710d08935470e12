// Model configs: the named ones satisfy the schema and the kernels'
// constraints; a config read back from JSON is validated, not cast.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { GPT_CONFIGS, GptConfig, validateGptConfig } from '../../src/model/config.ts';
import { NimbleError } from '../../src/protocol/errors.ts';
import { parseJson } from '../../src/protocol/messages.ts';

test('every named config round-trips through JSON and its schema, and passes validateGptConfig', () => {
  for (const [name, config] of Object.entries(GPT_CONFIGS)) {
    const back = parseJson(GptConfig, JSON.stringify(config), `config ${name}`, 'corrupt');
    assert.deepEqual(back, config);
    validateGptConfig(back);
  }
  assert.deepEqual(parseJson(GptConfig, JSON.stringify({ ...GPT_CONFIGS['gpt-micro'], init: 'gpt2' })).init, 'gpt2');
});

test('malformed configs are refused by the schema', () => {
  const good = GPT_CONFIGS['gpt-micro'];
  const refused = (value: unknown, where: RegExp): void => {
    assert.throws(() => parseJson(GptConfig, JSON.stringify(value), 'config', 'corrupt'), (e: unknown) => e instanceof NimbleError && e.code === 'corrupt' && where.test(e.message));
  };
  refused({ ...good, layers: 0 }, /\/layers/);
  refused({ ...good, channels: 16.5 }, /\/channels/);
  refused({ ...good, heads: '2' }, /\/heads/);
  refused({ ...good, init: 'xavier' }, /\/init/);
  const { vocabSize: _, ...noVocab } = good;
  refused(noVocab, /\/vocabSize/);
  assert.throws(() => parseJson(GptConfig, '{"vocabSize":', 'config', 'corrupt'), /not JSON/);
});

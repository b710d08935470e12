// nbcli generate: a completion from a model deployed on the network, streamed
// to the terminal as the miners produce it (docs/inference.md, "Serve"). It
// calls the orchestrator's OpenAI-compatible POST /v1/completions
// (src/api/completion-client.ts), with the API key of --api-key or
// $NIMBLE_API_KEY when the network asks for one.
import type { Command } from 'commander';
import { MAX_COMPLETION_TOKENS, MAX_STOPS, MAX_TEMPERATURE } from '../../api/completions.ts';
import { streamCompletion } from '../../api/completion-client.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { DEFAULT_ORCHESTRATOR, emit, parsePositiveInt, withCommonOptions, type CommonOptions } from '../common.ts';

interface Flags extends CommonOptions {
  model: string;
  prompt: string;
  maxTokens: string;
  temperature: string;
  topP: string;
  seed: string;
  stop: string[];
  apiKey?: string;
  orchestrator: string;
}

/** A number flag within [min, max], or an 'invalid' error naming the flag. */
function numberIn(flag: string, value: string, min: number, max: number, exclusiveMin = false): number {
  const n = Number(value);
  if (!(Number.isFinite(n) && (exclusiveMin ? n > min : n >= min) && n <= max)) throw new NimbleError('invalid', `${flag} must be a number in ${exclusiveMin ? '(' : '['}${min}, ${max}], got '${value}'`);
  return n;
}

export function registerGenerate(program: Command): void {
  withCommonOptions(
    program
      .command('generate')
      .description('generate text with a model deployed on the network, streamed as the miners serve it')
      .requiredOption('--model <name>', "the deployed model's name or sha256 (nbcli model list)")
      .requiredOption('--prompt <text>', 'the text to continue')
      .option('--max-tokens <n>', 'tokens to generate at most', '128')
      .option('--temperature <t>', `sampling temperature in [0, ${MAX_TEMPERATURE}] (0: greedy)`, '0.8')
      .option('--top-p <p>', 'nucleus sampling: keep the smallest set of tokens holding this probability', '1')
      .option('--seed <s>', 'sampling seed: the same seed gives the same text', '0')
      .option('--stop <text>', `stop before this text (up to ${MAX_STOPS}; repeat the flag)`, (v: string, all: string[]) => [...all, v], [] as string[])
      .option('--api-key <key>', 'the API key to pay with (default: $NIMBLE_API_KEY)')
      .option('--orchestrator <url>', 'the orchestrator to ask', DEFAULT_ORCHESTRATOR),
  ).action(async (flags: Flags) => {
    const maxTokens = parsePositiveInt('--max-tokens', flags.maxTokens, 128);
    if (maxTokens > MAX_COMPLETION_TOKENS) throw new NimbleError('invalid', `--max-tokens is at most ${MAX_COMPLETION_TOKENS}, got ${maxTokens}`);
    const temperature = numberIn('--temperature', flags.temperature, 0, MAX_TEMPERATURE);
    const topP = numberIn('--top-p', flags.topP, 0, 1, true);
    const seed = Number(flags.seed);
    if (!Number.isSafeInteger(seed)) throw new NimbleError('invalid', `--seed must be an integer, got '${flags.seed}'`);
    if (flags.stop.length > MAX_STOPS) throw new NimbleError('invalid', `at most ${MAX_STOPS} --stop sequences`);
    if (flags.prompt.length === 0) throw new NimbleError('invalid', '--prompt must not be empty');
    const apiKey = flags.apiKey ?? process.env.NIMBLE_API_KEY;
    const body = { model: flags.model, prompt: flags.prompt, max_tokens: maxTokens, temperature, top_p: topP, seed, ...(flags.stop.length ? { stop: flags.stop } : {}) };
    const human = !flags.json;
    if (human) process.stdout.write(flags.prompt);
    const out = await streamCompletion(flags.orchestrator, body, (text) => human && process.stdout.write(text), { apiKey });
    if (human) process.stdout.write('\n');
    else emit(flags, { id: out.id, model: flags.model, prompt: flags.prompt, text: out.text, finishReason: out.finishReason }, () => '');
  });
}

// nbcli generate: a completion from a model deployed on the network, streamed
// to the terminal as the miners produce it (docs/inference.md, "Serve"). It
// calls the orchestrator's OpenAI-compatible POST /v1/completions
// (src/api/completion-client.ts), with the API key of --api-key or
// $NIMBLE_API_KEY when the network asks for one. With --chat it calls POST
// /v1/chat/completions instead (the model's chat template): --prompt is the
// user's message (after --system's), or without --prompt each line typed is
// one, the conversation kept, until an empty line or the end of the input.
import { createInterface } from 'node:readline';
import type { Command } from 'commander';
import { CHAT_ROLES } from '../../api/chat.ts';
import { MAX_COMPLETION_TOKENS, MAX_STOPS, MAX_TEMPERATURE } from '../../api/completions.ts';
import { streamChatCompletion, streamCompletion } from '../../api/completion-client.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { DEFAULT_ORCHESTRATOR, emit, parsePositiveInt, withCommonOptions, type CommonOptions } from '../common.ts';

interface Flags extends CommonOptions {
  model: string;
  prompt?: string;
  chat?: boolean;
  system?: string;
  message: string[];
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
      .option('--prompt <text>', 'the text to continue (with --chat: the user\'s message; without it, an interactive chat)')
      .option('--chat', "chat with the model (POST /v1/chat/completions, the model's chat template)")
      .option('--system <text>', 'with --chat: the system message')
      .option('--message <role:text>', `with --chat: a message of the conversation before --prompt (role ${CHAT_ROLES.join(', ')}; repeat the flag)`, (v: string, all: string[]) => [...all, v], [] as string[])
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
    if (flags.prompt !== undefined && flags.prompt.length === 0) throw new NimbleError('invalid', '--prompt must not be empty');
    const apiKey = flags.apiKey ?? process.env.NIMBLE_API_KEY;
    const sampling = { model: flags.model, max_tokens: maxTokens, temperature, top_p: topP, seed, ...(flags.stop.length ? { stop: flags.stop } : {}) };
    const human = !flags.json;
    if (flags.chat) return chat(flags, sampling, apiKey);
    if (flags.system !== undefined || flags.message.length) throw new NimbleError('invalid', '--system and --message go with --chat');
    if (flags.prompt === undefined) throw new NimbleError('invalid', '--prompt is required (or --chat for a conversation)');
    const body = { ...sampling, prompt: flags.prompt };
    if (human) process.stdout.write(flags.prompt);
    const out = await streamCompletion(flags.orchestrator, body, (text) => human && process.stdout.write(text), { apiKey });
    if (human) process.stdout.write('\n');
    else emit(flags, { id: out.id, model: flags.model, prompt: flags.prompt, text: out.text, finishReason: out.finishReason }, () => '');
  });
}

type Message = { role: (typeof CHAT_ROLES)[number]; content: string };

/** --message role:text, checked. */
function messageOf(flag: string): Message {
  const i = flag.indexOf(':');
  const role = flag.slice(0, Math.max(0, i));
  if (i < 0 || !(CHAT_ROLES as readonly string[]).includes(role)) throw new NimbleError('invalid', `--message must read ROLE:TEXT with ROLE one of ${CHAT_ROLES.join(', ')}, got '${flag.slice(0, 40)}'`);
  return { role: role as Message['role'], content: flag.slice(i + 1) };
}

/** The chat mode: one turn for --prompt, else a turn per line of the input until an empty line or its end. */
async function chat(flags: Flags, sampling: Record<string, unknown>, apiKey: string | undefined): Promise<void> {
  const human = !flags.json;
  const messages: Message[] = [...(flags.system !== undefined ? [{ role: 'system' as const, content: flags.system }] : []), ...flags.message.map(messageOf)];
  const turn = async (content: string): Promise<void> => {
    messages.push({ role: 'user', content });
    const out = await streamChatCompletion(flags.orchestrator, { ...sampling, model: flags.model, messages }, (text) => human && process.stdout.write(text), { apiKey });
    messages.push({ role: 'assistant', content: out.text });
    if (human) process.stdout.write('\n');
    else emit(flags, { id: out.id, model: flags.model, messages: messages.slice(0, -1), text: out.text, finishReason: out.finishReason }, () => '');
  };
  if (flags.prompt !== undefined) return turn(flags.prompt);
  const lines = createInterface({ input: process.stdin, terminal: false });
  if (human) process.stderr.write(`chat with ${flags.model}: a line is a message; an empty line or the end of the input ends it\n> `);
  for await (const line of lines) {
    if (line.trim() === '') break;
    await turn(line);
    if (human) process.stderr.write('> ');
  }
  lines.close();
}

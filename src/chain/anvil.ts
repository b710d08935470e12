// The anvil node process (Foundry's EVM dev node, shipped in the npm package
// @foundry-rs/anvil): start it on a loopback port, load and dump its state,
// stop it. src/chain/node.ts decides when; this file only knows how.
import { execFileSync, spawn } from 'node:child_process';
import { closeSync, existsSync, openSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { basename, dirname, join } from 'node:path';
import { gunzipSync } from 'node:zlib';
import { Type, type Static, type TSchema } from '@sinclair/typebox';
import { childEnv } from '../protocol/child-env.ts';
import { NimbleError } from '../protocol/errors.ts';
import { parse } from '../protocol/messages.ts';
import { HexString } from './schemas.ts';

export interface AnvilOptions {
  /** Where anvil's stdout/stderr go (truncated at start); the listening port is read from it. */
  logFile: string;
  /** 0 (default): the OS picks a free port. Always bound to 127.0.0.1. */
  port?: number;
  chainId?: number;
  /** Load this state file (written by dumpAnvilState) when it exists. */
  stateFile?: string;
  /** Milliseconds to wait for the node to listen. */
  startTimeoutMs?: number;
}

export interface AnvilProcess {
  pid: number;
  port: number;
  rpcUrl: string;
  /** Stops the node (SIGTERM, then SIGKILL after 5 s); resolves when it has exited. */
  stop(): Promise<void>;
}

export const LOCAL_CHAIN_ID = 31337;

/** Path of the anvil binary from the platform package next to @foundry-rs/anvil. */
export function anvilBinary(): string {
  const require = createRequire(import.meta.url);
  const os = process.platform === 'win32' ? 'win32' : process.platform;
  const arch = process.arch === 'x64' ? 'amd64' : process.arch;
  const pkg = `@foundry-rs/anvil-${os}-${arch}`;
  try {
    const dir = dirname(require.resolve(`${pkg}/package.json`));
    return join(dir, 'bin', process.platform === 'win32' ? 'anvil.exe' : 'anvil');
  } catch {
    throw new Error(`the anvil binary for ${process.platform}/${process.arch} (${pkg}) is not installed`);
  }
}

export async function startAnvil(opts: AnvilOptions): Promise<AnvilProcess> {
  const args = ['--host', '127.0.0.1', '--port', String(opts.port ?? 0), '--chain-id', String(opts.chainId ?? LOCAL_CHAIN_ID)];
  if (opts.stateFile && existsSync(opts.stateFile)) args.push('--load-state', opts.stateFile);
  const log = openSync(opts.logFile, 'w');
  let exited: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  let exitWaiters: (() => void)[] = [];
  // the node needs nothing of this process's environment but the basics (no keys, no passwords)
  const child = spawn(anvilBinary(), args, { stdio: ['ignore', log, log], detached: true, env: childEnv() });
  closeSync(log);
  child.on('exit', (code, signal) => {
    exited = { code, signal };
    for (const w of exitWaiters) w();
    exitWaiters = [];
  });
  const spawnError = new Promise<Error>((resolve) => child.once('error', resolve));
  const pid = child.pid;
  const deadline = Date.now() + (opts.startTimeoutMs ?? 15_000);
  let port = 0;
  while (!port) {
    const text = readFileSync(opts.logFile, 'utf8');
    const m = /Listening on 127\.0\.0\.1:(\d+)/.exec(text);
    if (m) port = Number(m[1]);
    else if (exited || pid === undefined) {
      const err = await Promise.race([spawnError, sleep(50).then(() => undefined)]);
      throw new Error(`anvil did not start: ${err?.message ?? lastLines(text)}`);
    } else if (Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(`anvil did not listen within ${opts.startTimeoutMs ?? 15_000} ms: ${lastLines(text)}`);
    } else await sleep(10);
  }
  const waitExit = (): Promise<void> =>
    exited ? Promise.resolve() : new Promise<void>((resolve) => exitWaiters.push(resolve));
  return {
    pid: pid as number,
    port,
    rpcUrl: `http://127.0.0.1:${port}`,
    async stop(): Promise<void> {
      if (exited) return;
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
      await waitExit();
      clearTimeout(timer);
    },
  };
}

/** Stops an anvil process this process did not spawn (found through a pid file). */
export async function stopPid(pid: number, timeoutMs = 5_000): Promise<void> {
  if (!isAlive(pid)) return;
  process.kill(pid, 'SIGTERM');
  const deadline = Date.now() + timeoutMs;
  while (isAlive(pid)) {
    if (Date.now() > deadline) {
      process.kill(pid, 'SIGKILL');
      await sleep(50);
      return;
    }
    await sleep(20);
  }
}

export function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** The command line of process `pid` (Linux: /proc; elsewhere ps), or null when it cannot be read. */
export function processArgs(pid: number): string[] | null {
  try {
    const raw = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
    return raw.split('\0').filter((a) => a !== '');
  } catch {
    // no /proc here (macOS), or the process is gone
  }
  try {
    const line = execFileSync('ps', ['-o', 'args=', '-p', String(pid)], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
    return line ? line.split(/\s+/) : null;
  } catch {
    return null;
  }
}

/** Whether process `pid` runs an anvil binary (checked before stopping a pid read from a file: pids are reused). */
export function isAnvilProcess(pid: number): boolean {
  const args = processArgs(pid);
  return args !== null && args.length > 0 && /^anvil(\.exe)?$/.test(basename(args[0]));
}

/** A JSON-RPC answer: a result or an error. */
const RpcAnswer = Type.Object({
  result: Type.Optional(Type.Unknown()),
  error: Type.Optional(Type.Object({ message: Type.String() })),
});

/** The result schema of a call whose answer is not used. */
export const RPC_ANY = Type.Unknown();

/**
 * One JSON-RPC call over HTTP; its result validated against `result`. An
 * answer that is not JSON-RPC, or whose result does not match, is a NimbleError
 * 'unreachable' naming the method and the node.
 */
export async function rpc<T extends TSchema>(
  rpcUrl: string,
  method: string,
  params: readonly unknown[],
  result: T,
  timeoutMs = 10_000,
): Promise<Static<T>> {
  const res = await fetch(rpcUrl, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method, params }),
    signal: AbortSignal.timeout(timeoutMs),
  });
  const what = `answer to ${method} from ${rpcUrl}`;
  const text = await res.text();
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    throw new NimbleError('unreachable', `invalid ${what}: not JSON (HTTP ${res.status})`);
  }
  const body = fromNode(RpcAnswer, json, what);
  if (body.error) throw new Error(`${method}: ${body.error.message}`);
  return fromNode(result, body.result, what);
}

/** `value` checked against `schema`; a mismatch is the node's fault (502), not the caller's. */
function fromNode<T extends TSchema>(schema: T, value: unknown, what: string): Static<T> {
  try {
    return parse(schema, value, what);
  } catch (err) {
    throw new NimbleError('unreachable', err instanceof Error ? err.message : String(err), undefined, { cause: err });
  }
}

/**
 * Asks the node for its full state (anvil_dumpState) and writes it to `file`
 * atomically (temporary file + rename), in the format --load-state reads.
 */
export async function dumpAnvilState(rpcUrl: string, file: string): Promise<void> {
  const hex = await rpc(rpcUrl, 'anvil_dumpState', [], HexString, 60_000);
  let bytes: Buffer = Buffer.from(hex.replace(/^0x/, ''), 'hex');
  if (bytes[0] === 0x1f && bytes[1] === 0x8b) bytes = gunzipSync(bytes);
  const tmp = `${file}.${process.pid}.tmp`;
  writeFileSync(tmp, bytes);
  renameSync(tmp, file);
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function lastLines(text: string): string {
  return text.trim().split('\n').slice(-3).join(' | ') || '(no output)';
}

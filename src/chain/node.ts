// The local chain node of a data dir: <data-dir>/chain/ holds anvil's state
// (state.json), who runs the node (node.json: pid, port, owner) and a lock.
//
// A short nbcli command takes the lock, starts anvil from state.json (about
// 50 ms), does its work, dumps the state atomically and stops the node, so the
// node is never left half-written. A long-running process (the orchestrator,
// later `nbcli up`) opens the node as persistent: it dumps the state every few
// seconds and on close, and other commands reuse it through node.json while
// its owner lives. A node whose owner died (crash, kill -9) is adopted by the
// next command, which dumps its state and stops it, or stopped by
// `nbcli chain stop` (stopLocalNode: by the recorded pid, once it is checked
// to be an anvil process).
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, renameSync, rmSync, statSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { Type } from '@sinclair/typebox';
import { NimbleError } from '../protocol/errors.ts';
import { LOCAL_CHAIN_ID, dumpAnvilState, isAlive, isAnvilProcess, processArgs, rpc, startAnvil, stopPid } from './anvil.ts';
import { HexQuantity, readJsonFile } from './schemas.ts';

export interface LocalNodeFile {
  pid: number;
  port: number;
  rpcUrl: string;
  chainId: number;
  /** pid of the process that dumps the state and will stop the node */
  ownerPid: number;
  persistent: boolean;
  startedAt: string;
}

/** node.json as read back (written from a LocalNodeFile). */
const LocalNodeFileSchema = Type.Object({
  pid: Type.Integer({ minimum: 1 }),
  port: Type.Integer({ minimum: 1, maximum: 65535 }),
  rpcUrl: Type.String({ pattern: '^http://127\\.0\\.0\\.1:[0-9]+$' }),
  chainId: Type.Integer({ minimum: 1 }),
  ownerPid: Type.Integer({ minimum: 1 }),
  persistent: Type.Boolean(),
  startedAt: Type.String(),
});

export interface LocalNode {
  rpcUrl: string;
  chainId: number;
  /** the anvil process */
  pid: number;
  /** the process that will dump its state and stop it (this one when `owned`) */
  ownerPid: number;
  /** true when this process started or adopted the node and will stop it on release */
  owned: boolean;
  /** Writes the chain state to disk now (owner only; a no-op otherwise). */
  dump(): Promise<void>;
  /** Owner: dumps the state, stops the node, frees the lock. Otherwise nothing. */
  release(): Promise<void>;
}

export interface OpenLocalNodeOptions {
  /** Keep the node running for other commands until release(); dump every dumpEveryMs. */
  persistent?: boolean;
  dumpEveryMs?: number;
  /** How long to wait for another command holding the node. */
  lockTimeoutMs?: number;
}

export function chainDir(dataDir: string): string {
  return join(dataDir, 'chain');
}

export function localNodePaths(dataDir: string): { dir: string; state: string; node: string; lock: string; log: string } {
  const dir = chainDir(dataDir);
  return {
    dir,
    state: join(dir, 'state.json'),
    node: join(dir, 'node.json'),
    lock: join(dir, 'anvil.lock'),
    log: join(dir, 'anvil.log'),
  };
}

export async function openLocalNode(dataDir: string, opts: OpenLocalNodeOptions = {}): Promise<LocalNode> {
  const paths = localNodePaths(dataDir);
  mkdirSync(paths.dir, { recursive: true });
  await acquireLock(paths.lock, opts.lockTimeoutMs ?? 120_000);
  try {
    const running = await readRunningNode(paths.node);
    if (running && running.persistent && isAlive(running.ownerPid)) {
      rmSync(paths.lock, { force: true });
      return borrowed(running);
    }
    let stopNode: () => Promise<void>;
    let info: LocalNodeFile;
    if (running) {
      // adopt a node whose owner is gone
      info = { ...running, ownerPid: process.pid, persistent: !!opts.persistent };
      stopNode = () => stopPid(running.pid);
    } else {
      const anvil = await startAnvil({ logFile: paths.log, stateFile: paths.state, chainId: LOCAL_CHAIN_ID });
      info = {
        pid: anvil.pid,
        port: anvil.port,
        rpcUrl: anvil.rpcUrl,
        chainId: LOCAL_CHAIN_ID,
        ownerPid: process.pid,
        persistent: !!opts.persistent,
        startedAt: new Date().toISOString(),
      };
      stopNode = () => anvil.stop();
    }
    writeJsonAtomic(paths.node, info);
    return owned(info, paths, stopNode, opts);
  } catch (err) {
    rmSync(paths.lock, { force: true });
    throw err;
  }
}

function borrowed(info: LocalNodeFile): LocalNode {
  return {
    rpcUrl: info.rpcUrl,
    chainId: info.chainId,
    pid: info.pid,
    ownerPid: info.ownerPid,
    owned: false,
    dump: async () => {},
    release: async () => {},
  };
}

function owned(
  info: LocalNodeFile,
  paths: ReturnType<typeof localNodePaths>,
  stopNode: () => Promise<void>,
  opts: OpenLocalNodeOptions,
): LocalNode {
  let dumping: Promise<void> = Promise.resolve();
  const dump = (): Promise<void> => {
    dumping = dumping.then(() => dumpAnvilState(info.rpcUrl, paths.state));
    return dumping;
  };
  let timer: NodeJS.Timeout | undefined;
  if (opts.persistent) {
    rmSync(paths.lock, { force: true }); // others may now borrow the node
    timer = setInterval(() => void dump().catch(() => {}), opts.dumpEveryMs ?? 5_000);
    timer.unref();
  }
  let released = false;
  return {
    rpcUrl: info.rpcUrl,
    chainId: info.chainId,
    pid: info.pid,
    ownerPid: info.ownerPid,
    owned: true,
    dump,
    async release(): Promise<void> {
      if (released) return;
      released = true;
      if (timer) clearInterval(timer);
      try {
        await dump();
        await stopNode();
        rmSync(paths.node, { force: true });
      } finally {
        if (!opts.persistent) rmSync(paths.lock, { force: true });
      }
    },
  };
}

/** node.json when its node is alive and answering; else removes the stale file (stopping a hung node). */
async function readRunningNode(file: string): Promise<LocalNodeFile | undefined> {
  if (!existsSync(file)) return undefined;
  let info: LocalNodeFile;
  try {
    info = readJsonFile(LocalNodeFileSchema, file, 'local node file');
  } catch {
    // unreadable or not what this code writes: treated as no node
    rmSync(file, { force: true });
    return undefined;
  }
  if (isAlive(info.pid)) {
    try {
      const id = await rpc(info.rpcUrl, 'eth_chainId', [], HexQuantity, 3_000);
      if (Number(id) === info.chainId) return info;
    } catch {
      // not answering: stop it below
    }
    await stopPid(info.pid);
  }
  rmSync(file, { force: true });
  return undefined;
}

/** Creates `file` exclusively with our pid; waits while a live process holds it. */
async function acquireLock(file: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      const fd = openSync(file, 'wx');
      writeSync(fd, String(process.pid));
      closeSync(fd);
      return;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
    let holder: number;
    try {
      holder = Number(readFileSync(file, 'utf8'));
    } catch {
      continue; // removed meanwhile
    }
    const stale = Number.isInteger(holder) && holder > 0 ? !isAlive(holder) : ageMs(file) > 5_000;
    if (stale) {
      rmSync(file, { force: true });
      continue;
    }
    if (Date.now() > deadline) {
      throw new Error(`the local chain in ${file} is busy (held by process ${holder}); try again`);
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

function ageMs(file: string): number {
  try {
    return Date.now() - statSync(file).mtimeMs;
  } catch {
    return Infinity;
  }
}

export function writeJsonAtomic(file: string, value: unknown): void {
  const tmp = `${file}.${process.pid}.tmp`;
  const fd = openSync(tmp, 'w');
  writeSync(fd, JSON.stringify(value, null, 2) + '\n');
  closeSync(fd);
  renameSync(tmp, file);
}

/** What `nbcli chain status` shows of a data dir's local node. */
export type LocalNodeStatus =
  | { running: false; stateFile: string; hasState: boolean; staleFile: boolean }
  | (LocalNodeFile & { running: true; stateFile: string; ownerAlive: boolean; anvil: boolean; answering: boolean });

/** node.json as written, or undefined when there is none (or it is not what this code writes); reads only. */
function readNodeFile(file: string): LocalNodeFile | undefined {
  if (!existsSync(file)) return undefined;
  try {
    return readJsonFile(LocalNodeFileSchema, file, 'local node file');
  } catch {
    return undefined;
  }
}

/** The data dir's local node as node.json records it, checked against the process table and its RPC; changes nothing. */
export async function localNodeStatus(dataDir: string): Promise<LocalNodeStatus> {
  const paths = localNodePaths(dataDir);
  const info = readNodeFile(paths.node);
  if (!info || !isAlive(info.pid)) return { running: false, stateFile: paths.state, hasState: existsSync(paths.state), staleFile: existsSync(paths.node) };
  let answering = false;
  try {
    answering = Number(await rpc(info.rpcUrl, 'eth_chainId', [], HexQuantity, 3_000)) === info.chainId;
  } catch {
    // not answering
  }
  return { ...info, running: true, stateFile: paths.state, ownerAlive: isAlive(info.ownerPid), anvil: isAnvilProcess(info.pid), answering };
}

export interface StoppedNode {
  /** the anvil process stopped (null: none was running) */
  pid: number | null;
  /** its state was written to state.json first */
  saved: boolean;
  stateFile: string;
}

/**
 * `nbcli chain stop`: stops the data dir's local node, by the pid node.json
 * records, once that pid is checked to be an anvil process (never a process
 * the pid was reused for) and no live process keeps the node (an orchestrator
 * stops its own node, saving it, when it stops). The state is saved first.
 * Waits for a command using the node to finish (the lock).
 */
export async function stopLocalNode(dataDir: string, lockTimeoutMs = 30_000): Promise<StoppedNode> {
  const paths = localNodePaths(dataDir);
  if (!existsSync(paths.dir)) return { pid: null, saved: false, stateFile: paths.state };
  await acquireLock(paths.lock, lockTimeoutMs);
  try {
    const info = readNodeFile(paths.node);
    if (!info || !isAlive(info.pid)) {
      rmSync(paths.node, { force: true });
      return { pid: null, saved: false, stateFile: paths.state };
    }
    if (!isAnvilProcess(info.pid)) {
      const args = processArgs(info.pid);
      throw new NimbleError('conflict', `process ${info.pid} that ${paths.node} names is not an anvil node (${args ? `it runs '${args.join(' ').slice(0, 120)}'` : 'its command line cannot be read'}): not stopped; if the file is stale, remove it`);
    }
    if (info.ownerPid !== process.pid && isAlive(info.ownerPid)) {
      throw new NimbleError('conflict', `the local chain node (anvil pid ${info.pid}, ${info.rpcUrl}) is kept by process ${info.ownerPid}, which still runs (an orchestrator or nbcli up of this data dir): stop that process, and it saves and stops its node`);
    }
    let saved = true;
    await dumpAnvilState(info.rpcUrl, paths.state).catch(() => (saved = false));
    await stopPid(info.pid);
    rmSync(paths.node, { force: true });
    return { pid: info.pid, saved, stateFile: paths.state };
  } finally {
    rmSync(paths.lock, { force: true });
  }
}

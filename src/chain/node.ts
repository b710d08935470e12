// The local chain node of a data dir: <data-dir>/chain/ holds anvil's state
// (state.json), who runs the node (node.json: pid, port, owner) and a lock.
//
// A short nbcli command takes the lock, starts anvil from state.json (about
// 50 ms), does its work, dumps the state atomically and stops the node, so the
// node is never left half-written. A long-running process (the orchestrator,
// later `nbcli up`) opens the node as persistent: it dumps the state every few
// seconds and on close, and other commands reuse it through node.json while
// its owner lives. A node whose owner died (crash, Ctrl-C) is adopted by the
// next command, which dumps its state and stops it.
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, renameSync, rmSync, statSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { Type } from '@sinclair/typebox';
import { LOCAL_CHAIN_ID, dumpAnvilState, isAlive, rpc, startAnvil, stopPid } from './anvil.ts';
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

// nbcli orchestrator start: the coordinator of a network, with its state in
// the data dir's SQLite file or in PostgreSQL (--db), and its blobs in the
// data dir too or in an S3 bucket (--blobs).
import { NimbleError } from '../../protocol/errors.ts';
import { join } from 'node:path';
import type { Command } from 'commander';
import { parseDuration } from '../../jobs/duration.ts';
import { describeBlobStore, parseBlobStoreUrl, type BlobStoreSpec } from '../../orchestrator/blobs/blob-store-url.ts';
import { startOrchestrator } from '../../orchestrator/server.ts';
import { describeStateTarget, parseStateTarget } from '../../orchestrator/state/target.ts';
import { isPostgresUrl } from '../../orchestrator/state/index.ts';
import { joinCluster } from '../../orchestrator/cluster/member.ts';
import { DEFAULT_LEASE_TTL_MS } from '../../orchestrator/cluster/lease.ts';
import { MAX_SYNTHETIC_RATE } from '../../orchestrator/serving/synthetic-prompts.ts';
import { emit, parseBytes, parsePositiveInt, resolveDataDir, waitForSignal, withCommonOptions } from '../common.ts';
import { nodeOnStop, orchestratorChain, withOrchestratorChainOptions, type OrchestratorChainFlags } from './orchestrator-chain.ts';

interface Flags extends OrchestratorChainFlags {
  host: string;
  port: string;
  minerTimeoutMs: string;
  deadlineMs: string;
  checkRate: string;
  inferenceCheckRate: string;
  syntheticPrompts?: string;
  slashFraction: string;
  checkpointRetention: string;
  storeLimit: string;
  diskReserve: string;
  freeStore: string;
  modelRetention: string;
  blobs?: string;
  db?: string;
  leaseTtl?: string;
  advertise?: string;
}

export function registerOrchestrator(program: Command): void {
  const group = program.command('orchestrator').description('run the coordinator of a network');
  withCommonOptions(withOrchestratorChainOptions(
    group
      .command('start')
      .description('start an orchestrator (HTTP API, SQLite state and blobs in <data-dir>/orchestrator)')
      .option('--host <host>', 'address to listen on', '127.0.0.1')
      .option('--port <port>', 'port to listen on (0: any free port)', '7070')
      .option('--miner-timeout-ms <ms>', 'a miner silent this long is gone', '4000')
      .option('--deadline-ms <ms>', 'a microbatch not finished this long after issue is re-issued elsewhere', '15000')
      .option('--check-rate <share>', 'share of forwards the orchestrator recomputes (spot checks; 0 disables)', '0.02')
      .option('--inference-check-rate <share>', "share of served inference windows (a session's calls at one stage) the orchestrator recomputes (0 disables)", '0.02')
      .option('--synthetic-prompts <rate>', `send this many completion requests a second (at most ${MAX_SYNTHETIC_RATE}) to the models being served, prompts from Moby Dick, billed to nobody, so that serving miners earn without outside users (default: none)`)
      .option('--db <url>', 'where the state is kept: postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE (the password may come from $PGPASSWORD instead), or a SQLite file (default: <data-dir>/orchestrator/orchestrator.sqlite)')
      .option('--blobs <url>', "where blobs (checkpoints, stage weights, pseudo-gradients) are kept: a folder, or s3://BUCKET[/PREFIX][?endpoint=URL&region=R&pathStyle=true] for any S3-compatible store, credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE (default: <data-dir>/orchestrator/blobs)")
      .option('--lease-ttl <duration>', `with --db postgres://: how long the leading orchestrator's lease lives unrenewed, so how soon another takes over when it dies (default ${DEFAULT_LEASE_TTL_MS / 1000}s)`)
      .option('--advertise <url>', 'with --db postgres://: the URL the other orchestrators forward requests to while this one leads (default: http://HOST:PORT)')
      .option('--checkpoint-retention <duration>', "how long an ended job's checkpoints are kept (e.g. 3d, 12h)", '3d')
      .option('--store-limit <bytes>', 'all stored models and datasets together at most (e.g. 16GiB); a store past it is refused', '16GiB')
      .option('--disk-reserve <bytes>', "free disk a model or dataset store must leave on the blob folder's file system for training", '2GiB')
      .option('--free-store <bytes>', 'unpaid, unpublished models and unpaid datasets kept for free, for the whole network together; past it a model or dataset is stored only paid (NIM per GB-day)', '1GiB')
      .option('--model-retention <duration>', 'an unpublished stored model is collected this long after it was stored, unless kept longer (nbcli model keep)', '3d')
      .option('--slash-fraction <share>', 'share of its stake a miner loses for each offence: a failed spot check, a forged receipt or claim, a poisoned merge (paid networks)', '0.05'),
  )).action(async (flags: Flags) => {
    const port = Number(flags.port);
    if (!Number.isInteger(port) || port < 0 || port > 65535) throw new NimbleError('invalid', `--port must be 0-65535, got '${flags.port}'`);
    const dataDir = join(resolveDataDir(flags), 'orchestrator');
    const blobs: BlobStoreSpec | undefined = flags.blobs === undefined ? undefined : parseBlobStoreUrl(flags.blobs);
    const db = flags.db === undefined ? undefined : parseStateTarget(flags.db);
    const coordinator = {
      minerTimeoutMs: parsePositiveInt('--miner-timeout-ms', flags.minerTimeoutMs, 4000),
      microbatchDeadlineMs: parsePositiveInt('--deadline-ms', flags.deadlineMs, 15000),
      spotChecks: { rate: parseShare('--check-rate', flags.checkRate) },
      slashing: { fraction: parseShare('--slash-fraction', flags.slashFraction) },
    };
    const inferenceChecks = { rate: parseShare('--inference-check-rate', flags.inferenceCheckRate) };
    let syntheticPrompts: { rate: number } | undefined;
    if (flags.syntheticPrompts !== undefined) {
      const rate = Number(flags.syntheticPrompts);
      if (flags.syntheticPrompts.trim() === '' || !(rate > 0 && rate <= MAX_SYNTHETIC_RATE)) throw new NimbleError('invalid', `--synthetic-prompts must be a number of requests a second in (0, ${MAX_SYNTHETIC_RATE}], got '${flags.syntheticPrompts}'`);
      syntheticPrompts = { rate };
    }
    let checkpointRetentionMs: number;
    try {
      checkpointRetentionMs = parseDuration(flags.checkpointRetention);
    } catch (err) {
      throw new NimbleError('invalid', `--checkpoint-retention: ${(err as Error).message}`);
    }
    let modelRetentionMs: number;
    try {
      modelRetentionMs = parseDuration(flags.modelRetention);
    } catch (err) {
      throw new NimbleError('invalid', `--model-retention: ${(err as Error).message}`);
    }
    const storage = { storeLimitBytes: parseBytes('--store-limit', flags.storeLimit), diskReserveBytes: bytesOrZero('--disk-reserve', flags.diskReserve), freeStoreBytes: bytesOrZero('--free-store', flags.freeStore), retentionMs: modelRetentionMs };
    let leaseTtlMs: number | undefined;
    if (flags.leaseTtl !== undefined) {
      if (db === undefined || !isPostgresUrl(db)) throw new NimbleError('invalid', '--lease-ttl is for orchestrators sharing a PostgreSQL state (--db postgres://…)');
      try {
        leaseTtlMs = parseDuration(flags.leaseTtl);
      } catch (err) {
        throw new NimbleError('invalid', `--lease-ttl: ${(err as Error).message}`);
      }
      if (leaseTtlMs < 500 || leaseTtlMs > 600_000) throw new NimbleError('invalid', `--lease-ttl must be from 500ms to 10m, got '${flags.leaseTtl}'`);
    }
    let advertiseUrl: string | undefined;
    if (flags.advertise !== undefined) {
      if (db === undefined || !isPostgresUrl(db)) throw new NimbleError('invalid', '--advertise is for orchestrators sharing a PostgreSQL state (--db postgres://…)');
      let u: URL;
      try {
        u = new URL(flags.advertise);
      } catch {
        throw new NimbleError('invalid', `--advertise must be an http(s) URL, got '${flags.advertise}'`);
      }
      if ((u.protocol !== 'http:' && u.protocol !== 'https:') || u.username || u.password || u.search || u.hash || (u.pathname !== '/' && u.pathname !== '')) {
        throw new NimbleError('invalid', `--advertise must be an http(s) URL with no path, query or credentials, got '${flags.advertise}'`);
      }
      advertiseUrl = u.origin;
    }
    const log = (line: string): void => {
      if (flags.json) process.stdout.write(JSON.stringify({ event: 'log', message: line }) + '\n');
      else process.stderr.write(`orchestrator: ${line}\n`);
    };
    const chain = await orchestratorChain(flags, log);
    const paid = chain ? `paying ${flags.emission ?? '100'} NIM per epoch on chain ${chain.client.chainId}` : 'unpaid (--no-chain)';
    const blobsWhere = describeBlobStore(blobs ?? { kind: 'fs', dir: join(dataDir, 'blobs') });
    const stateWhere = db === undefined ? join(dataDir, 'orchestrator.sqlite') : describeStateTarget(db);
    // a login URL is good once, for a short while: each next one is printed when it is made
    const onLoginUrl = (url: string, why: string): void => emit(flags, { event: 'login', login: url, why }, () => `dashboard: ${why}; the next operator login URL: ${url}`);
    const options = { dataDir, db, blobs, walletsDataDir: resolveDataDir(flags), host: flags.host, port, coordinator, chain: chain ?? undefined, checkpointRetentionMs, storage, inferenceChecks, syntheticPrompts, onLoginUrl };
    const where = `state in ${db === undefined ? dataDir : stateWhere}${blobs ? `, blobs in ${blobsWhere}` : ''}; ${paid}`;
    const listening = (url: string, extra: Record<string, unknown>): Record<string, unknown> => ({ event: 'listening', url, dataDir, state: stateWhere, blobs: blobsWhere, chainId: chain?.client.chainId ?? null, ...extra });
    if (db !== undefined && isPostgresUrl(db)) {
      // several orchestrators may share this database: each answers, one leads (src/orchestrator/cluster/)
      let member;
      try {
        member = await joinCluster({
          orchestrator: { ...options, db },
          leaseTtlMs,
          advertiseUrl,
          log,
          onLeading: (orch, term) =>
            emit(flags, { event: 'leading', url: orch.url, term, dashboard: `${orch.url}/`, login: orch.loginUrl }, () => `orchestrator leading on ${orch.url} (term ${term}; ${where})\ndashboard: ${orch.url}/ (to act as the operator, log in with ${orch.loginUrl}, good once)`),
          // nothing this process would still do can be written: stop at once, a supervisor may start it again as a follower
          onLost: (why) => {
            process.stderr.write(`nbcli: stopped leading: ${why}; exiting\n`);
            process.exit(3);
          },
        });
      } catch (err) {
        await chain?.close?.();
        throw err;
      }
      const orch = member.orchestrator();
      // listening for the signal before saying so: a SIGTERM sent on reading the line still stops it cleanly (its node saved and stopped)
      const signalled = waitForSignal();
      emit(flags, listening(member.url, { role: orch ? 'leader' : 'follower', holder: member.holder, dashboard: `${member.url}/`, login: orch?.loginUrl ?? null }), () =>
        orch
          ? `orchestrator listening on ${member.url}, leading (${where})\ndashboard: ${member.url}/ (to act as the operator, log in with ${orch.loginUrl}, good once)`
          : `orchestrator listening on ${member.url}, following: it forwards to the leader and takes over when the leader stops (${where})`,
      );
      await signalled;
      await member.close();
      await chain?.close?.();
      const stopped = nodeOnStop(chain, resolveDataDir(flags));
      if (stopped) log(stopped);
      return;
    }
    let orch;
    try {
      orch = await startOrchestrator(options);
    } catch (err) {
      await chain?.close?.();
      throw err;
    }
    const signalled = waitForSignal();
    emit(flags, listening(orch.url, { dashboard: `${orch.url}/`, login: orch.loginUrl }), () => `orchestrator listening on ${orch.url} (${where})\ndashboard: ${orch.url}/ (to act as the operator, log in with ${orch.loginUrl}, good once)`);
    await signalled;
    await orch.close();
    const stopped = nodeOnStop(chain, resolveDataDir(flags));
    if (stopped) log(stopped);
  });
}

/** An amount of bytes (512MB, 2GiB), or 0. */
function bytesOrZero(flag: string, value: string): number {
  return value.trim() === '0' ? 0 : parseBytes(flag, value);
}

/** A number in [0, 1]. */
function parseShare(flag: string, value: string): number {
  const n = Number(value);
  if (value.trim() === '' || !Number.isFinite(n) || n < 0 || n > 1) throw new NimbleError('invalid', `${flag} must be a number from 0 to 1, got '${value}'`);
  return n;
}

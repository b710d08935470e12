// nbcli orchestrator start: the coordinator of a network, with its state in
// the data dir's SQLite file or in PostgreSQL (--db), and its blobs in the
// data dir too or in an S3 bucket (--blobs).
import { NimbleError } from '../protocol/errors.ts';
import { join } from 'node:path';
import type { Command } from 'commander';
import { parseDuration } from '../jobs/duration.ts';
import { describeBlobStore, parseBlobStoreUrl, type BlobStoreSpec } from '../orchestrator/blob-store-url.ts';
import { startOrchestrator } from '../orchestrator/server.ts';
import { describeStateTarget, parseStateTarget } from '../orchestrator/state/target.ts';
import { MAX_SYNTHETIC_RATE } from '../orchestrator/serving/synthetic-prompts.ts';
import { emit, parsePositiveInt, resolveDataDir, withCommonOptions } from './common.ts';
import { orchestratorChain, withOrchestratorChainOptions, type OrchestratorChainFlags } from './orchestrator-chain.ts';

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
  blobs?: string;
  db?: string;
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
      .option('--checkpoint-retention <duration>', "how long an ended job's checkpoints are kept (e.g. 3d, 12h)", '3d')
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
    const log = (line: string): void => {
      if (flags.json) process.stdout.write(JSON.stringify({ event: 'log', message: line }) + '\n');
      else process.stderr.write(`orchestrator: ${line}\n`);
    };
    const chain = await orchestratorChain(flags, log);
    let orch;
    try {
      orch = await startOrchestrator({ dataDir, db, blobs, walletsDataDir: resolveDataDir(flags), host: flags.host, port, coordinator, chain: chain ?? undefined, checkpointRetentionMs, inferenceChecks, syntheticPrompts });
    } catch (err) {
      await chain?.close?.();
      throw err;
    }
    const paid = chain ? `paying ${flags.emission ?? '100'} NIM per epoch on chain ${chain.client.chainId}` : 'unpaid (--no-chain)';
    const blobsWhere = describeBlobStore(blobs ?? { kind: 'fs', dir: join(dataDir, 'blobs') });
    const stateWhere = db === undefined ? join(dataDir, 'orchestrator.sqlite') : describeStateTarget(db);
    emit(flags, { event: 'listening', url: orch.url, dataDir, state: stateWhere, blobs: blobsWhere, chainId: chain?.client.chainId ?? null, dashboard: `${orch.url}/`, login: orch.loginUrl }, () => `orchestrator listening on ${orch.url} (state in ${db === undefined ? dataDir : stateWhere}${blobs ? `, blobs in ${blobsWhere}` : ''}; ${paid})\ndashboard: ${orch.url}/ (to act as the operator, log in once with ${orch.loginUrl})`);
    await waitForSignal();
    await orch.close();
  });
}

/** A number in [0, 1]. */
function parseShare(flag: string, value: string): number {
  const n = Number(value);
  if (value.trim() === '' || !Number.isFinite(n) || n < 0 || n > 1) throw new NimbleError('invalid', `${flag} must be a number from 0 to 1, got '${value}'`);
  return n;
}

/** Resolves on SIGINT or SIGTERM. */
export function waitForSignal(): Promise<string> {
  return new Promise((resolve) => {
    const on = (sig: string): void => {
      process.off('SIGINT', on);
      process.off('SIGTERM', on);
      resolve(sig);
    };
    process.on('SIGINT', on);
    process.on('SIGTERM', on);
  });
}

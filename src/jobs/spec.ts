// A job's description, `nimble.job.json` (docs/jobs.md): what to train
// (a named GPT, an inline GPT config, or an MLP classifier), on what data,
// for how long, with which limits and the most NIM the developer will pay.
// `validateJobSpec` gives every problem at once, each naming its field and
// what was expected; `resolveJobSpec` fills in the defaults.
import { Type, type Static, type TInteger } from '@sinclair/typebox';
import { Value, type ValueError } from '@sinclair/typebox/value';
import { SPAM_MAX_FEATURES } from '../data/spam.ts';
import { GPT_CONFIGS, GPT_LIMITS, MAX_GPT_PARAMS, type GptConfig } from '../model/config.ts';
import { MAX_MLP_PARAMS, MLP_LIMITS, mlpParamCountOf } from '../model/mlp.ts';
import { NimbleError } from '../protocol/errors.ts';
import { parseDuration } from './duration.ts';

const Size = (max: number): TInteger => Type.Integer({ minimum: 1, maximum: max });

export const GptModelSpec = Type.Object(
  {
    type: Type.Literal('gpt'),
    vocabSize: Size(GPT_LIMITS.vocabSize),
    contextLength: Size(GPT_LIMITS.contextLength),
    channels: Size(GPT_LIMITS.channels),
    layers: Size(GPT_LIMITS.layers),
    heads: Size(GPT_LIMITS.heads),
    mlpRatio: Type.Optional(Size(GPT_LIMITS.mlpRatio)),
  },
  { additionalProperties: false },
);
export type GptModelSpec = Static<typeof GptModelSpec>;

export const MlpModelSpec = Type.Object(
  {
    type: Type.Literal('mlp'),
    inputs: Size(MLP_LIMITS.inputs),
    hidden: Type.Array(Size(MLP_LIMITS.hidden), { minItems: 0, maxItems: MLP_LIMITS.hiddenLayers }),
    classes: Type.Integer({ minimum: 2, maximum: MLP_LIMITS.classes }),
  },
  { additionalProperties: false },
);
export type MlpModelSpec = Static<typeof MlpModelSpec>;

/** Durations as text: `90s`, `30m`, `6h`, `3d` (./duration.ts). */
const Duration = Type.String({ pattern: '^[0-9]+(\\.[0-9]+)?(ms|s|m|h|d)$' });
/** NIM as a decimal string (18 decimals at most). */
const Nim = Type.String({ pattern: '^[0-9]{1,12}(\\.[0-9]{1,18})?$' });

export const JobSpec = Type.Object(
  {
    name: Type.String({ minLength: 1, maxLength: 64, pattern: '^[A-Za-z0-9][A-Za-z0-9_.-]*$' }),
    /** a named GPT (`gpt-tiny`, …), an inline GPT config, or an MLP classifier */
    model: Type.Union([Type.Union(Object.keys(GPT_CONFIGS).map((name) => Type.Literal(name))), GptModelSpec, MlpModelSpec]),
    /** `moby-dick`, `spam-assassin`, or the path of a local text file or folder (uploaded once, by content) */
    data: Type.String({ minLength: 1, maxLength: 1024 }),
    training: Type.Object(
      {
        /** optimizer steps (microbatches), or… */
        steps: Type.Optional(Type.Integer({ minimum: 1, maximum: 10_000_000 })),
        /** …tokens: steps = ceil(tokens / (batchSize × context)) */
        tokens: Type.Optional(Type.Integer({ minimum: 1, maximum: Number.MAX_SAFE_INTEGER })),
        batchSize: Type.Optional(Type.Integer({ minimum: 1, maximum: 4096 })),
        learningRate: Type.Optional(Type.Number({ minimum: 1e-8, maximum: 1 })),
        /** inner steps per replica between merges */
        mergeEvery: Type.Optional(Type.Integer({ minimum: 1, maximum: 1_000_000 })),
        seed: Type.Optional(Type.Integer({ minimum: 0, maximum: 2 ** 31 - 1 })),
      },
      { additionalProperties: false },
    ),
    /** keep a whole-model checkpoint every this many steps (and at the end) */
    checkpointEvery: Type.Optional(Type.Integer({ minimum: 1, maximum: 10_000_000 })),
    limits: Type.Optional(
      Type.Object(
        {
          /** wall-clock limit: past it the job ends `timed_out`, its last checkpoint kept */
          timeout: Type.Optional(Duration),
          /** no progress for this long (no miners, or stalled): the job ends `idle_stopped` */
          idleTimeout: Type.Optional(Duration),
          /** when the developer wants it done: the plan meets it if it can (default: the timeout) */
          deadline: Type.Optional(Duration),
        },
        { additionalProperties: false },
      ),
    ),
    /** the most NIM the developer will pay (escrowed when the job is submitted) */
    budget: Type.Optional(Nim),
    /** NIM per PFLOP of training offered (default: the network's price): waiting jobs are placed in order of offer, aged so none starves */
    offer: Type.Optional(Type.Number({ minimum: 0, maximum: 1e12 })),
    /** the orchestrator upgrades the job itself (once) when one miner cannot meet its deadline, or none holds the whole model */
    autoUpgrade: Type.Optional(Type.Boolean()),
  },
  { additionalProperties: false },
);
export type JobSpec = Static<typeof JobSpec>;

/** Data sets every miner can load by name. */
export const NAMED_DATA_SETS = ['moby-dick', 'spam-assassin'] as const;
/** Which named data sets fit which kind of model. */
const DATA_FOR: Record<'gpt' | 'mlp', readonly string[]> = { gpt: ['moby-dick'], mlp: ['spam-assassin'] };

export const DEFAULT_TIMEOUT = '24h';
/**
 * The longest `limits.timeout` (7 days): a paid job's escrow must stay locked
 * for its owner until the job has run and its work is paid
 * (src/orchestrator/jobs/job-payments.ts), so a job cannot run unbounded.
 */
export const MAX_TIMEOUT = '7d';
export const MAX_TIMEOUT_MS = parseDuration(MAX_TIMEOUT);
export const DEFAULT_IDLE_TIMEOUT = '10m';
export const DEFAULT_BATCH_SIZE = 12;
export const DEFAULT_LEARNING_RATE = 1e-3;
export const DEFAULT_MERGE_EVERY = 100;
export const DEFAULT_SEED = 1337;

/** A job's model, resolved. */
export type JobModel = { kind: 'gpt'; name: string | null; config: GptConfig } | { kind: 'mlp'; inputs: number; hidden: number[]; classes: number };

/** A validated spec with every default filled in. */
export interface ResolvedJob {
  name: string;
  model: JobModel;
  data: string;
  steps: number;
  batchSize: number;
  learningRate: number;
  mergeEvery: number;
  seed: number;
  checkpointEvery: number;
  timeoutMs: number;
  idleTimeoutMs: number;
  deadlineMs: number;
  /** the budget in wei (null: no budget, an unpaid network) */
  budgetWei: bigint | null;
  /** NIM per PFLOP offered (null: the network's price) */
  offer: number | null;
}

/** One problem with a spec: the field (a JSON pointer such as `/training/steps`) and what was expected. */
export interface SpecProblem {
  path: string;
  message: string;
}

/** A job spec with problems, each named by its path: a 400 'invalid'. */
export class JobSpecError extends NimbleError {
  override readonly name = 'JobSpecError';
  constructor(
    readonly problems: SpecProblem[],
    source = 'job spec',
  ) {
    super('invalid', `${source} is not valid:\n${problems.map((p) => `  ${p.path || '/'}: ${p.message}`).join('\n')}`);
  }
}

/** Every problem with `value` as a job spec; empty when it is valid. */
export function jobSpecProblems(value: unknown): SpecProblem[] {
  if (!Value.Check(JobSpec, value)) return schemaProblems(value);
  return semanticProblems(value);
}

/** Checks `value` and returns it typed, or throws a JobSpecError listing every problem. */
export function validateJobSpec(value: unknown, source?: string): JobSpec {
  const problems = jobSpecProblems(value);
  if (problems.length) throw new JobSpecError(problems, source);
  return value as JobSpec;
}

/** Parses the text of a `nimble.job.json`. */
export function parseJobSpec(text: string, source = 'nimble.job.json'): JobSpec {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    throw new JobSpecError([{ path: '', message: `not JSON: ${(err as Error).message}` }], source);
  }
  return validateJobSpec(value, source);
}

/** The model a spec names, resolved (the spec must be valid). */
export function jobModel(model: JobSpec['model']): JobModel {
  if (typeof model === 'string') return { kind: 'gpt', name: model, config: GPT_CONFIGS[model] };
  if (model.type === 'mlp') return { kind: 'mlp', inputs: model.inputs, hidden: [...model.hidden], classes: model.classes };
  const { type: _type, ...sizes } = model;
  return { kind: 'gpt', name: null, config: { ...sizes, mlpRatio: sizes.mlpRatio ?? 4 } };
}

/** Tokens (GPT) or examples (MLP) one step trains on. */
export function itemsPerStep(model: JobModel, batchSize: number): number {
  return model.kind === 'gpt' ? batchSize * model.config.contextLength : batchSize;
}

/** The spec with its defaults filled in (the spec must be valid). */
export function resolveJobSpec(spec: JobSpec): ResolvedJob {
  const model = jobModel(spec.model);
  const batchSize = spec.training.batchSize ?? DEFAULT_BATCH_SIZE;
  const steps = spec.training.steps ?? Math.ceil(spec.training.tokens! / itemsPerStep(model, batchSize));
  const timeoutMs = parseDuration(spec.limits?.timeout ?? DEFAULT_TIMEOUT);
  return {
    name: spec.name,
    model,
    data: spec.data,
    steps,
    batchSize,
    learningRate: spec.training.learningRate ?? DEFAULT_LEARNING_RATE,
    mergeEvery: spec.training.mergeEvery ?? DEFAULT_MERGE_EVERY,
    seed: spec.training.seed ?? DEFAULT_SEED,
    checkpointEvery: spec.checkpointEvery ?? steps,
    timeoutMs,
    idleTimeoutMs: parseDuration(spec.limits?.idleTimeout ?? DEFAULT_IDLE_TIMEOUT),
    deadlineMs: spec.limits?.deadline ? parseDuration(spec.limits.deadline) : timeoutMs,
    budgetWei: spec.budget === undefined ? null : nimToWei(spec.budget),
    offer: spec.offer ?? null,
  };
}

function nimToWei(nim: string): bigint {
  const [whole, frac = ''] = nim.split('.');
  return BigInt(whole) * 10n ** 18n + BigInt(frac.padEnd(18, '0'));
}

/** TypeBox's errors, one per field, in words a developer reads. */
function schemaProblems(value: unknown): SpecProblem[] {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return [{ path: '', message: 'expected a JSON object' }];
  const byPath = new Map<string, SpecProblem>();
  for (const e of Value.Errors(JobSpec, value)) {
    const path = e.path;
    // a union's branches each complain: say once what the field may be
    if (path === '/model' || path.startsWith('/model/')) {
      byPath.set('/model', modelProblem((value as Record<string, unknown>).model));
      continue;
    }
    // the deepest error of a field says most; keep the first
    if (!byPath.has(path) && ![...byPath.keys()].some((p) => p.startsWith(path + '/'))) byPath.set(path, { path, message: describe(e) });
  }
  return [...byPath.values()].filter((p) => !(p.path === '/model' && p.message === ''));
}

function modelProblem(model: unknown): SpecProblem {
  const path = '/model';
  if (model === undefined) return { path, message: `required: a model name (${Object.keys(GPT_CONFIGS).join(', ')}) or an object with "type": "gpt" or "mlp"` };
  if (typeof model === 'string') return { path, message: `expected a model name (${Object.keys(GPT_CONFIGS).join(', ')}), got '${model.slice(0, 64)}'` };
  if (typeof model !== 'object' || model === null || Array.isArray(model)) return { path, message: 'expected a model name or an object with "type": "gpt" or "mlp"' };
  const type = (model as Record<string, unknown>).type;
  const schema = type === 'gpt' ? GptModelSpec : type === 'mlp' ? MlpModelSpec : null;
  if (!schema) return { path: '/model/type', message: `expected "gpt" or "mlp", got ${JSON.stringify(type) ?? 'nothing'}` };
  const first = Value.Errors(schema, model).First();
  return first ? { path: `/model${first.path}`, message: describe(first) } : { path, message: '' };
}

function describe(e: ValueError): string {
  const s = e.schema as Record<string, unknown>;
  const got = e.value === undefined ? 'nothing' : JSON.stringify(e.value)?.slice(0, 80);
  if (e.value === undefined) return 'required';
  if (e.message.includes('Unexpected property')) return 'unknown field';
  if (s.type === 'integer') return `expected an integer${range(s)}, got ${got}`;
  if (s.type === 'number') return `expected a number${range(s)}, got ${got}`;
  if (s.pattern === '^[0-9]+(\\.[0-9]+)?(ms|s|m|h|d)$') return `expected a duration such as "90s", "30m", "6h" or "3d", got ${got}`;
  if (s.pattern === '^[0-9]{1,12}(\\.[0-9]{1,18})?$') return `expected an amount of NIM as a decimal string such as "25" or "2.5", got ${got}`;
  if (s.type === 'string') return `expected text${s.pattern ? ` matching ${String(s.pattern)}` : ''}${s.maxLength ? ` of at most ${String(s.maxLength)} characters` : ''}, got ${got}`;
  if (s.type === 'array') return `expected a list${s.maxItems !== undefined ? ` of at most ${String(s.maxItems)} items` : ''}, got ${got}`;
  if (s.type === 'object') return `expected an object, got ${got}`;
  return `${e.message}, got ${got}`;
}

function range(s: Record<string, unknown>): string {
  const min = s.minimum ?? s.exclusiveMinimum;
  const max = s.maximum;
  if (min !== undefined && max !== undefined) return ` from ${String(min)} to ${String(max)}`;
  if (min !== undefined) return ` of at least ${String(min)}`;
  return max !== undefined ? ` of at most ${String(max)}` : '';
}

/** What the schema cannot say: fields that depend on each other. */
function semanticProblems(spec: JobSpec): SpecProblem[] {
  const problems: SpecProblem[] = [];
  const add = (path: string, message: string): void => void problems.push({ path, message });
  const kind = typeof spec.model === 'string' ? 'gpt' : spec.model.type;
  if (typeof spec.model === 'object' && spec.model.type === 'gpt') {
    const m = spec.model;
    if (m.channels % m.heads !== 0) add('/model/heads', `must divide channels (${m.channels}), got ${m.heads}`);
    if (m.vocabSize > 256) add('/model/vocabSize', `the tokenizer is bytes: at most 256, got ${m.vocabSize}`);
    const C = m.channels;
    const params = m.vocabSize * C * 2 + m.contextLength * C + m.layers * (12 * C * C + 13 * C) + 2 * C;
    if (params > MAX_GPT_PARAMS) add('/model', `${params} parameters; at most ${MAX_GPT_PARAMS}`);
  }
  if (typeof spec.model === 'object' && spec.model.type === 'mlp' && spec.data === 'spam-assassin' && spec.model.classes !== 2) {
    add('/model/classes', `spam-assassin has 2 classes (ham, spam), got ${spec.model.classes}`);
  }
  if (typeof spec.model === 'object' && spec.model.type === 'mlp') {
    const params = mlpParamCountOf(spec.model);
    if (params > MAX_MLP_PARAMS) add('/model', `${params} parameters; at most ${MAX_MLP_PARAMS}`);
    if (spec.data === 'spam-assassin' && spec.model.inputs > SPAM_MAX_FEATURES) add('/model/inputs', `spam-assassin's features are hashed into at most ${SPAM_MAX_FEATURES} buckets, got ${spec.model.inputs}`);
  }
  const named = (NAMED_DATA_SETS as readonly string[]).includes(spec.data);
  if (named && !DATA_FOR[kind].includes(spec.data)) add('/data', `'${spec.data}' is not data for a ${kind.toUpperCase()} (use ${DATA_FOR[kind].map((d) => `'${d}'`).join(' or ')}, or a local path)`);
  if (!named && kind === 'mlp') add('/data', `an MLP classifier trains on a named data set (${DATA_FOR.mlp.join(', ')})`);
  const t = spec.training;
  if (t.steps === undefined && t.tokens === undefined) add('/training', 'give steps or tokens');
  if (t.steps !== undefined && t.tokens !== undefined) add('/training', 'give steps or tokens, not both');
  for (const [key, value] of Object.entries(spec.limits ?? {})) {
    if (value !== undefined && parseDuration(value) < 1000) add(`/limits/${key}`, `at least 1s, got "${value}"`);
  }
  const timeout = spec.limits?.timeout;
  if (timeout !== undefined && parseDuration(timeout) > MAX_TIMEOUT_MS) add('/limits/timeout', `at most ${MAX_TIMEOUT} (a job's escrow stays locked while it runs, so a job's run is bounded), got "${timeout}"`);
  return problems;
}

// The shared plumbing of the engine's one-pipeline WGSL kernels (every kernel
// but the SGEMM): a kernel is declared as its parameters, its arrays and the
// body of its entry point; this file writes the rest of the WGSL (the
// parameter block, one binding per array, an accessor per array that adds the
// array's offset, the entry point with a linear workgroup index), compiles it,
// and at each call checks extents and aliasing, fills the parameter block and
// records the dispatch (recorder.ts). Sizes beyond
// maxComputeWorkgroupsPerDimension workgroups spill into a second dispatch
// dimension.
import { createArray, type GpuArray } from './buffers.ts';
import { recorderOf } from './recorder.ts';

/** An array, or a window of one starting `offset` elements in (offsets are in elements, as in `gemm.ts`). */
export type GpuRef = GpuArray | { array: GpuArray; offset: number };

export type ElementType = 'f32' | 'u32' | 'i32';

export interface ArraySpec {
  name: string;
  /** element type in WGSL; default f32 (int arrays live in GpuArrays too: 4 bytes an element) */
  type?: ElementType;
  /** bound read_write, with a `set_<name>(i, v)` accessor; it must not share a buffer with any other array of the call */
  write?: boolean;
}

export interface KernelSpec {
  label: string;
  /** invocations per workgroup; a power of two where the body reduces across the workgroup */
  workgroupSize: number;
  /** u32 parameters, read in WGSL as `p.<name>` */
  uints?: readonly string[];
  /** f32 parameters, read as `p.<name>` */
  floats?: readonly string[];
  /** bindings 1, 2, ... in this order; read as `<name>(i)`, written as `set_<name>(i, v)` */
  arrays: readonly ArraySpec[];
  /** WGSL placed before the entry point (helper functions, workgroup memory) */
  lib?: string;
  /**
   * The entry point's body. It sees `group` (the linear workgroup index,
   * uniform), `lid` (local_invocation_index) and `gid` (group · WG + lid).
   * Dispatches are rounded up to whole workgroups and may hold spare
   * workgroups, so the body checks its bounds. With the workgroup memory not
   * zeroed (device.ts), it writes every workgroup cell before reading it.
   */
  body: string;
}

/** One array of a call: where it is and how many elements from its offset on the kernel touches. */
export interface ArrayUse {
  ref: GpuRef;
  length: number;
}

export interface KernelCall {
  uints?: Record<string, number>;
  floats?: Record<string, number>;
  arrays: Record<string, ArrayUse>;
  /** workgroups to run (0: nothing is dispatched) */
  groups: number;
}

/** Shorthand for an ArrayUse. */
export function use(ref: GpuRef, length: number): ArrayUse {
  return { ref, length };
}

function arrayOf(ref: GpuRef): GpuArray {
  return 'array' in ref ? ref.array : ref;
}

function offsetOf(ref: GpuRef): number {
  return 'array' in ref ? ref.offset : 0;
}

/**
 * An f32 constant as a WGSL literal that is exactly the float32 the WASM
 * kernels use (AssemblyScript rounds an f32 constant to nearest, and so does
 * Math.fround): no rounding is left to the WGSL compiler.
 */
export function f32(x: number): string {
  const s = String(Math.fround(x));
  return /[.e]/.test(s) ? s : `${s}.0`;
}

/** Checks that `v` is a u32 (sizes, counts); `what` names it in the error. */
function checkU32(what: string, v: number): void {
  if (!Number.isInteger(v) || v < 0 || v > 0xffffffff) throw new RangeError(`${what} = ${v} is not a u32`);
}

/** One compiled kernel. */
export class GpuKernel {
  private readonly paramBytes: number;

  private constructor(
    private readonly device: GPUDevice,
    readonly spec: KernelSpec,
    private readonly pipeline: GPUComputePipeline,
    /** the device's limit, or a smaller one to exercise the second dispatch dimension in tests */
    private readonly maxGroupsPerDimension: number,
  ) {
    const fields = (spec.uints?.length ?? 0) + spec.arrays.length + (spec.floats?.length ?? 0);
    this.paramBytes = Math.ceil((fields * 4) / 16) * 16;
  }

  /** Compiles the kernel; rejects with the compiler's message if its WGSL is wrong. */
  static async create(device: GPUDevice, spec: KernelSpec, maxGroupsPerDimension?: number): Promise<GpuKernel> {
    const module = device.createShaderModule({ label: spec.label, code: kernelWgsl(spec) });
    const pipeline = await device.createComputePipelineAsync({ label: spec.label, layout: 'auto', compute: { module, entryPoint: 'main' } });
    const max = Math.min(maxGroupsPerDimension ?? Infinity, device.limits.maxComputeWorkgroupsPerDimension);
    return new GpuKernel(device, spec, pipeline, max);
  }

  /** Checks the call, then records its dispatch (recorder.ts). Nothing waits here. */
  run(call: KernelCall): void {
    const { spec } = this;
    const label = spec.label;
    checkU32(`${label}: workgroups`, call.groups);
    const words = new ArrayBuffer(this.paramBytes);
    const u = new Uint32Array(words), f = new Float32Array(words);
    let at = 0;
    for (const name of spec.uints ?? []) {
      const v = call.uints?.[name];
      if (v === undefined) throw new Error(`${label}: parameter ${name} is missing`);
      checkU32(`${label}: ${name}`, v);
      u[at++] = v;
    }
    const refs = spec.arrays.map((a) => {
      const used = call.arrays[a.name];
      if (!used) throw new Error(`${label}: array ${a.name} is missing`);
      const array = arrayOf(used.ref), offset = offsetOf(used.ref);
      checkU32(`${label}: ${a.name} offset`, offset);
      checkU32(`${label}: ${a.name} length`, used.length);
      if (offset + used.length > array.length) {
        throw new RangeError(`${label}: ${a.name} needs ${offset + used.length} elements, its array holds ${array.length}`);
      }
      u[at++] = offset;
      return array;
    });
    for (const name of spec.floats ?? []) {
      const v = call.floats?.[name];
      if (v === undefined) throw new Error(`${label}: parameter ${name} is missing`);
      f[at++] = v;
    }
    spec.arrays.forEach((a, i) => {
      if (!a.write) return;
      const j = refs.findIndex((other, k) => k !== i && other.buffer === refs[i].buffer);
      if (j >= 0) throw new RangeError(`${label}: ${a.name} shares its buffer with ${spec.arrays[j].name} (WebGPU forbids a written binding aliasing another)`);
    });
    if (call.groups === 0) return;
    const x = Math.min(call.groups, this.maxGroupsPerDimension), y = Math.ceil(call.groups / x);
    if (y > this.maxGroupsPerDimension) throw new RangeError(`${label}: ${call.groups} workgroups exceed ${this.maxGroupsPerDimension}² (the device's limit)`);
    recorderOf(this.device).dispatch(label, this.pipeline, words, refs.map((a) => a.buffer), x, y);
  }

  /** Nothing to free: a call's parameter block belongs to the recorder's batch. */
  destroy(): void {}
}

/** The whole WGSL of a kernel: its declarations, accessors, `lib` and entry point. */
function kernelWgsl(spec: KernelSpec): string {
  const fields = [
    ...(spec.uints ?? []).map((n) => `${n}: u32`),
    ...spec.arrays.map((a) => `o_${a.name}: u32`),
    ...(spec.floats ?? []).map((n) => `${n}: f32`),
  ];
  const arrays = spec.arrays.map((a, i) => {
    const type = a.type ?? 'f32';
    const lines = [
      `@group(0) @binding(${i + 1}) var<storage, ${a.write ? 'read_write' : 'read'}> b_${a.name}: array<${type}>;`,
      `fn ${a.name}(i: u32) -> ${type} { return b_${a.name}[p.o_${a.name} + i]; }`,
    ];
    if (a.write) lines.push(`fn set_${a.name}(i: u32, v: ${type}) { b_${a.name}[p.o_${a.name} + i] = v; }`);
    return lines.join('\n');
  });
  return `// ${spec.label}
const WG: u32 = ${spec.workgroupSize}u;
struct Params { ${fields.join(', ')} }
@group(0) @binding(0) var<uniform> p: Params;
${arrays.join('\n')}
${spec.lib ?? ''}
@compute @workgroup_size(${spec.workgroupSize})
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u, @builtin(local_invocation_index) lid: u32) {
  let group = wid.y * nwg.x + wid.x;
  let gid = group * WG + lid;
${spec.body}
}
`;
}

/** Compiles several kernels at once (pipelines compile in parallel). */
export async function createKernels<K extends string>(device: GPUDevice, specs: Record<K, KernelSpec>, maxGroupsPerDimension?: number): Promise<Record<K, GpuKernel>> {
  const names = Object.keys(specs) as K[];
  const kernels = await Promise.all(names.map((n) => GpuKernel.create(device, specs[n], maxGroupsPerDimension)));
  return Object.fromEntries(names.map((n, i) => [n, kernels[i]])) as Record<K, GpuKernel>;
}

/** Frees every kernel's parameter block. */
export function destroyKernels(kernels: Record<string, GpuKernel>): void {
  for (const k of Object.values(kernels)) k.destroy();
}

/**
 * Int32 values (token ids, targets) in a GpuArray, after checking each is in
 * [0, limit): the kernels index rows with them, and on a GPU an index out of
 * range reads some other element instead of failing.
 */
export function uploadIndices(device: GPUDevice, values: Int32Array, limit: number, label?: string): GpuArray {
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (v < 0 || v >= limit) throw new RangeError(`${label ?? 'indices'}[${i}] = ${v} is outside [0, ${limit})`);
  }
  const array = createArray(device, values.length, label);
  if (values.length > 0) device.queue.writeBuffer(array.buffer, 0, values.buffer, values.byteOffset, values.byteLength);
  recorderOf(device).counts.bytesWritten += values.byteLength;
  return array;
}

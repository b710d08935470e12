// The WGSL of the element-wise kernels (src/engine/webgpu/elementwise.ts),
// each the formula of its WASM twin in assembly/elementwise.ts, operation by
// operation: residual add, accumulate, GELU (tanh form, through the ported
// exp), ReLU. One invocation per element.
import { EXP_WGSL } from './common.wgsl.ts';
import { f32, type KernelSpec } from './program.ts';

/** Invocations per workgroup of the element-wise kernels. */
export const ELEMENTWISE_WG = 256;

const GELU_K = Math.fround(0.7978845608028654); // sqrt(2/pi), as the f32 constant of the WASM kernel
const GELU_C = Math.fround(0.044715);

/** gelu(x) and gelu'(x) as assembly/elementwise.ts computes them (tanh(u) = 1 − 2 / (exp(2u) + 1)). */
const GELU_WGSL = /* wgsl */ `
${EXP_WGSL}
fn tanh_wasm(x: f32) -> f32 {
  let e = exp_cephes(x + x);
  return 1.0 - 2.0 / (e + 1.0);
}

fn gelu(x: f32) -> f32 {
  let x3 = (x * x) * x;
  let t = tanh_wasm(${f32(GELU_K)} * fma(${f32(GELU_C)}, x3, x));
  return (0.5 * x) * (1.0 + t);
}

fn gelu_grad(x: f32) -> f32 {
  let x2 = x * x;
  let x3 = x2 * x;
  let t = tanh_wasm(${f32(GELU_K)} * fma(${f32(GELU_C)}, x3, x));
  let sech2 = 1.0 - t * t;
  let du = ${f32(GELU_K)} * fma(${f32(3 * GELU_C)}, x2, 1.0);
  return 0.5 * fma(x * sech2, du, 1.0 + t);
}
`;

/** A kernel with one invocation per element i < p.n: `statement` writes element i. */
function perElement(label: string, arrays: KernelSpec['arrays'], statement: string, lib?: string): KernelSpec {
  return {
    label,
    workgroupSize: ELEMENTWISE_WG,
    uints: ['n'],
    arrays,
    lib,
    body: `  if (gid >= p.n) { return; }\n  let i = gid;\n  ${statement}`,
  };
}

export const ELEMENTWISE_SPECS = {
  add: perElement('addForward', [{ name: 'out', write: true }, { name: 'a' }, { name: 'b' }], 'set_out(i, a(i) + b(i));'),
  accumulate: perElement('accumulate', [{ name: 'dst', write: true }, { name: 'src' }], 'set_dst(i, dst(i) + src(i));'),
  geluForward: perElement('geluForward', [{ name: 'out', write: true }, { name: 'inp' }], 'set_out(i, gelu(inp(i)));', GELU_WGSL),
  geluBackward: perElement(
    'geluBackward',
    [{ name: 'dinp', write: true }, { name: 'inp' }, { name: 'dout' }],
    'set_dinp(i, gelu_grad(inp(i)) * dout(i));',
    GELU_WGSL,
  ),
  reluForward: perElement('reluForward', [{ name: 'out', write: true }, { name: 'inp' }], 'set_out(i, max(inp(i), 0.0));'),
  reluBackward: perElement(
    'reluBackward',
    [{ name: 'dinp', write: true }, { name: 'inp' }, { name: 'dout' }],
    'set_dinp(i, select(0.0, dout(i), inp(i) > 0.0));',
  ),
} satisfies Record<string, KernelSpec>;

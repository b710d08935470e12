// The WebGPU flags the engine passes when it makes buffers and maps them.

/**
 * GPUBufferUsage and GPUMapMode flags (WebGPU spec values). @webgpu/types
 * declares the globals, but Dawn for Node does not define them unless its
 * `globals` are copied onto globalThis, which this engine does not do.
 */
export const BufferUsage = {
  MAP_READ: 0x0001,
  COPY_SRC: 0x0004,
  COPY_DST: 0x0008,
  UNIFORM: 0x0040,
  STORAGE: 0x0080,
} as const;
/** GPUMapMode.READ */
export const MAP_READ_MODE = 0x0001;

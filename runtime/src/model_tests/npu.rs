//! The NPU run loop (`crate::npu::backend`) through marshalled buffers gives the host's logits.

use onebit_kernels::matmul::QMatrix;
use onebit_pack::spec::{Act, QkNorm};

use crate::testing::*;

/// Records every kernel an NPU engine is asked for, computing with the emulator.
#[derive(Default)]
struct Recording(std::sync::Mutex<Vec<String>>);

impl crate::npu::backend::KernelRunner for Recording {
    fn name(&self) -> &'static str {
        "recording"
    }

    fn gemm(
        &self,
        w: &QMatrix<'_>,
        shape: crate::npu::backend::Shape,
        acts: &[u8],
    ) -> crate::error::Result<Vec<u8>> {
        let name = crate::npu::backend::kernel_name(
            shape.m as u64,
            shape.k_padded as u64,
            shape.n_padded as u64,
        );
        self.0.lock().expect("lock").push(name);
        crate::npu::backend::Emulator.gemm(w, shape, acts)
    }
}

#[test]
fn the_npu_run_loop_through_marshalled_buffers_gives_the_host_logits() {
    use crate::npu::backend::NpuBackend;
    let sp = spec(QkNorm::BeforeRope, Act::GeluTanh, true);
    let (_d, host) = load(&sp);
    let (_d2, mut npu) = load(&sp);
    let engine = std::sync::Arc::new(NpuBackend::new(Recording::default(), 4));
    npu.set_backend(engine.clone());
    assert_eq!(npu.backend_name(), "npu recording");
    let toks: Vec<u32> = vec![1, 4, 8, 15, 16, 23, 42];
    let (mut hs, mut ns) = (host.session(16), npu.session(16));
    // A 7-token prefill (GEMM chunks of 4 and 3 rows) then one decode step (GEMV).
    let mut want = host.forward(&mut hs, &toks, true).expect("host");
    want.extend(host.forward(&mut hs, &[5], true).expect("host step"));
    let mut got = npu.forward(&mut ns, &toks, true).expect("npu");
    got.extend(npu.forward(&mut ns, &[5], true).expect("npu step"));
    let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        // bf16 activations and results on the NPU path, int8 activations on the host.
        assert!((g - w).abs() <= 0.03 * scale, "logit {i}: {g} vs {w}");
    }
    for t in 0..=toks.len() {
        let arg = |v: &[f32]| crate::sample::argmax(&v[t * V..(t + 1) * V]);
        assert_eq!(arg(&got), arg(&want), "token {t}");
    }
    let calls = engine.engine().0.lock().expect("lock").clone();
    let per_layer = 7;
    let layers = sp.layers.len();
    // Prefill: 2 chunks × 7 products per layer; the step: the same once. (This pack's head is
    // the tied bf16 embedding, a host product.)
    assert_eq!(calls.len(), 3 * per_layer * layers, "{calls:?}");
    assert!(calls.iter().any(|c| c.starts_with("gemm_4x")), "{calls:?}");
    assert!(calls.iter().any(|c| c.starts_with("gemv_1x")), "{calls:?}");
}

"""Stock CuPy: a cuFFT transform, checked against NumPy."""
import json

import cupy as cp
import numpy as np

signal = np.random.default_rng(2).standard_normal(4096)
spectrum = cp.asnumpy(cp.fft.fft(cp.asarray(signal)))
print("RESULT " + json.dumps({"fft_ok": bool(np.allclose(spectrum, np.fft.fft(signal), atol=1e-8)),
                              "first": [round(float(spectrum[0].real), 6), round(float(spectrum[1].imag), 6)]}))

// Switchboard web chat: the microphone's samples, as they come, to the page (chat.js records
// them and encodes a 16 kHz WAV when the caller stops). An AudioWorklet, not MediaRecorder:
// MediaRecorder's container differs by browser (WebM or MP4); not ScriptProcessorNode, which
// is deprecated. Posts blocks of about 85 ms, not every 128-sample render quantum.
"use strict";

class SwitchboardRecorder extends AudioWorkletProcessor {
  constructor() {
    super();
    this.block = new Float32Array(4096);
    this.filled = 0;
    this.port.onmessage = (e) => { if (e.data === "flush") this.flush(); };
  }

  flush() {
    if (this.filled) this.port.postMessage(this.block.slice(0, this.filled));
    this.filled = 0;
    this.port.postMessage("flushed");
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];  // the first channel: a caller's voice is mono
    if (channel) {
      let i = 0;
      while (i < channel.length) {
        const n = Math.min(channel.length - i, this.block.length - this.filled);
        this.block.set(channel.subarray(i, i + n), this.filled);
        this.filled += n;
        i += n;
        if (this.filled === this.block.length) {
          this.port.postMessage(this.block.slice(0));
          this.filled = 0;
        }
      }
    }
    return true;
  }
}

registerProcessor("switchboard-recorder", SwitchboardRecorder);

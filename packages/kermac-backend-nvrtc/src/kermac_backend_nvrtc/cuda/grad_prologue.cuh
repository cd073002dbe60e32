// The start of every gradient kernel's body after its thread coordinates and tile origin: the number
// of k tiles, the block's batch entry and output chunk (o0 .. o0 + OT), and the entry's operand offsets
// and hyperparameters.  Included inside the kernel; its opening brace is closed by the kernel's.
  const int ntiles = (K + BK - 1) / BK;

  {
    const long long zi = zbase + blockIdx.z;  // batch entry × output chunk (the host splits over 65535)
    const long long bidx = zi / ochunks;
    const int o0 = (int)(zi % ochunks) * OT;
    KM_BATCH_OFFSETS
    KM_HYPER_LOADS

"""GPU inventories written as data, in the shape of autotune.host.machine.gpu_facts(). The reference
machine is our reference user's: a GTX 1660 SUPER (cc 7.5) in the first slot beside an RTX 3090 (cc 8.6)."""


def gpu(index, name, cc, bus, uuid, total=24.0, free=23.5, processes=()):
    return {
        "index": index, "uuid": uuid, "name": name, "pci_bus_id": bus, "compute_capability": cc,
        "memory_total_gib": total, "memory_used_gib": round(total - free, 2), "memory_free_gib": free,
        "driver": "570.133.07", "processes": list(processes),
    }


GTX_1660S = gpu(0, "NVIDIA GeForce GTX 1660 SUPER", "7.5", "00000000:01:00.0",
                "GPU-5d3c9a0e-7f21-4b6a-9c1d-2e8f4a6b0c11", total=6.0, free=5.2,
                processes=[{"pid": 2310, "name": "Xorg", "command": "Xorg", "used_gib": 0.61}])
RTX_3090 = gpu(1, "NVIDIA GeForce RTX 3090", "8.6", "00000000:02:00.0",
               "GPU-af7b61d8-2c4e-4d8a-b0a4-93f1e2d7c6b5", total=24.0, free=23.58)
REFERENCE = [GTX_1660S, RTX_3090]

# Two identical models whose UUIDs share their first four hex digits.
TWIN_A = gpu(0, "NVIDIA GeForce RTX 3090", "8.6", "00000000:0A:00.0", "GPU-af7b0c2e-1111-2222-3333-444455556666")
TWIN_B = gpu(1, "NVIDIA GeForce RTX 3090", "8.6", "00000000:0B:00.0", "GPU-af7b61d8-aaaa-bbbb-cccc-ddddeeeeffff")
TWINS = [TWIN_A, TWIN_B]

RTX_4090 = gpu(1, "NVIDIA GeForce RTX 4090", "8.9", "00000000:02:00.0", "GPU-0b1c2d3e-0000-1111-2222-333344445555")

// arm64-cpuinfo.c — print a /proc/cpuinfo for the CPU that qemu-aarch64
// emulates (used by scripts/ci-arm64.sh).
//
// qemu-user 7.2 (Debian 12) hands an arm64 program the host's own
// /proc/cpuinfo, which on an x86-64 host names no ARM processor. The CPU
// detection inside onnxruntime (pytorch/cpuinfo) parses that file while
// libonnxruntime.so is being loaded, finds no processor in it, and dlopen
// crashes with SIGSEGV at address 0. qemu looks up the files a program opens under
// its QEMU_LD_PREFIX folder first, so ci-arm64.sh writes this program's
// output to PREFIX/proc/cpuinfo.
//
// Build with aarch64-linux-gnu-gcc, run under qemu-aarch64-static:
//
//	arm64-cpuinfo N
//
// prints N processors (the host's CPU count, which the emulated program
// also sees in /sys/devices/system/cpu), each with the Main ID register
// (MIDR_EL1, read as Linux lets user space read it) and the hardware
// capabilities (AT_HWCAP) of the emulated CPU, in the kernel's format.
#include <stdio.h>
#include <stdlib.h>
#include <sys/auxv.h>

// Names of the AT_HWCAP bits 0..31, as arch/arm64/kernel/cpuinfo.c prints
// them.
static const char *hwcap_names[32] = {
    "fp",     "asimd",    "evtstrm", "aes",    "pmull",   "sha1",  "sha2",   "crc32",
    "atomics", "fphp",    "asimdhp", "cpuid",  "asimdrdm", "jscvt", "fcma",  "lrcpc",
    "dcpop",  "sha3",     "sm3",     "sm4",    "asimddp", "sha512", "sve",   "asimdfhm",
    "dit",    "uscat",    "ilrcpc",  "flagm",  "ssbs",    "sb",    "paca",   "pacg",
};

int main(int argc, char **argv) {
	int n = argc > 1 ? atoi(argv[1]) : 1;
	if (n < 1) {
		fprintf(stderr, "arm64-cpuinfo: want a processor count >= 1, got %s\n", argv[1]);
		return 2;
	}
	unsigned long midr;
	__asm__ volatile("mrs %0, midr_el1" : "=r"(midr));
	unsigned long hwcap = getauxval(AT_HWCAP);
	for (int i = 0; i < n; i++) {
		printf("processor\t: %d\n", i);
		printf("BogoMIPS\t: 100.00\n");
		printf("Features\t:");
		for (int b = 0; b < 32; b++) {
			if (hwcap >> b & 1) {
				printf(" %s", hwcap_names[b]);
			}
		}
		printf("\n");
		printf("CPU implementer\t: 0x%02lx\n", midr >> 24 & 0xff);
		printf("CPU architecture: 8\n");
		printf("CPU variant\t: 0x%lx\n", midr >> 20 & 0xf);
		printf("CPU part\t: 0x%03lx\n", midr >> 4 & 0xfff);
		printf("CPU revision\t: %lu\n\n", midr & 0xf);
	}
	return 0;
}

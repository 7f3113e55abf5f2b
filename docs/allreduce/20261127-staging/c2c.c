#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <time.h>
#include <stdatomic.h>
#include <immintrin.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
#define CH (128<<10)
#define NS 4
static void ntcopy(char*d,const char*s,size_t n){for(size_t i=0;i<n;i+=64){__m256i a=_mm256_loadu_si256((const __m256i*)(s+i)),b=_mm256_loadu_si256((const __m256i*)(s+i+32));_mm256_stream_si256((__m256i*)(d+i),a);_mm256_stream_si256((__m256i*)(d+i+32),b);}_mm_sfence();}
int main(int argc,char**argv){int nt=atoi(argv[1]);size_t total=(size_t)256<<20;
 char*sh=mmap(0,NS*CH+4096,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
 _Atomic long*prod=(_Atomic long*)(sh+NS*CH),*cons=prod+8; *prod=0;*cons=0;
 char*src=aligned_alloc(4096,CH*64),*dst=aligned_alloc(4096,CH*64);memset(src,1,CH*64);memset(dst,0,CH*64);
 long n=total/CH; double t0=now();
 if(fork()==0){for(long k=0;k<n;k++){while(atomic_load(cons)<=k-NS);char*slot=sh+(k%NS)*CH; if(nt)ntcopy(slot,src+(k%64)*CH,CH); else memcpy(slot,src+(k%64)*CH,CH); atomic_store(prod,k+1);}_exit(0);}
 for(long k=0;k<n;k++){while(atomic_load(prod)<=k);memcpy(dst+(k%64)*CH,sh+(k%NS)*CH,CH);atomic_store(cons,k+1);}
 wait(0);double d=now()-t0;printf("%s %.2f GB/s\n",nt?"nt":"memcpy",total/d/1e9);}
